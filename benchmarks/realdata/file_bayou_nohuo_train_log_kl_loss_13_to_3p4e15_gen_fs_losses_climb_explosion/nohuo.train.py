[nltk_data] Downloading package wordnet to /home/ubuntu/nltk_data...
[nltk_data]   Package wordnet is already up-to-date!
Reading data file...
Extracted data for 100000 programs
Extracted data for 200000 programs
Extracted data for 300000 programs
Extracted data for 400000 programs
Extracted data for 500000 programs
Extracted data for 600000 programs
Extracted data for 700000 programs
  743933 programs/asts in training data
       0 programs/asts ignored by given config
  743933 programs/asts to search over
  959610 data points total
Done!
Model parameters: 50361480.0
1920/191900 (epoch 1) loss: 8.237, gen_loss: 8.051, Ret_loss 8.237, FS_loss 7.963, KL_loss: 13.235, 
	
1925/191900 (epoch 1) loss: 8.336, gen_loss: 8.149, Ret_loss 8.336, FS_loss 8.060, KL_loss: 12.937, 
	
1930/191900 (epoch 1) loss: 8.357, gen_loss: 8.170, Ret_loss 8.357, FS_loss 8.081, KL_loss: 12.978, 
	
1935/191900 (epoch 1) loss: 8.395, gen_loss: 8.208, Ret_loss 8.395, FS_loss 8.119, KL_loss: 12.960, 
	
1940/191900 (epoch 1) loss: 8.394, gen_loss: 8.210, Ret_loss 8.394, FS_loss 8.121, KL_loss: 13.281, 
	
1945/191900 (epoch 1) loss: 8.402, gen_loss: 8.221, Ret_loss 8.402, FS_loss 8.133, KL_loss: 13.839, 
	
1950/191900 (epoch 1) loss: 8.373, gen_loss: 8.195, Ret_loss 8.373, FS_loss 8.108, KL_loss: 14.566, 
	
1955/191900 (epoch 1) loss: 8.376, gen_loss: 8.205, Ret_loss 8.376, FS_loss 8.118, KL_loss: 16.396, 
	
1960/191900 (epoch 1) loss: 8.354, gen_loss: 8.190, Ret_loss 8.354, FS_loss 8.105, KL_loss: 19.469, 
	
1965/191900 (epoch 1) loss: 8.321, gen_loss: 8.167, Ret_loss 8.321, FS_loss 8.085, KL_loss: 25.574, 
	
1970/191900 (epoch 1) loss: 8.311, gen_loss: 8.170, Ret_loss 8.311, FS_loss 8.091, KL_loss: 38.608, 
	
1975/191900 (epoch 1) loss: 8.300, gen_loss: 8.175, Ret_loss 8.300, FS_loss 8.100, KL_loss: 62.116, 
	
1980/191900 (epoch 1) loss: 8.282, gen_loss: 8.178, Ret_loss 8.282, FS_loss 8.109, KL_loss: 106.933, 
	
1985/191900 (epoch 1) loss: 8.253, gen_loss: 8.171, Ret_loss 8.253, FS_loss 8.110, KL_loss: 180.973, 
	
1990/191900 (epoch 1) loss: 8.229, gen_loss: 8.175, Ret_loss 8.229, FS_loss 8.124, KL_loss: 311.021, 
	
1995/191900 (epoch 1) loss: 8.190, gen_loss: 8.167, Ret_loss 8.190, FS_loss 8.128, KL_loss: 522.626, 
	
2000/191900 (epoch 1) loss: 8.155, gen_loss: 8.166, Ret_loss 8.155, FS_loss 8.142, KL_loss: 854.487, 
	
2005/191900 (epoch 1) loss: 8.130, gen_loss: 8.180, Ret_loss 8.130, FS_loss 8.173, KL_loss: 1347.637, 
	
2010/191900 (epoch 1) loss: 8.092, gen_loss: 8.182, Ret_loss 8.092, FS_loss 8.194, KL_loss: 2096.774, 
	
2015/191900 (epoch 1) loss: 8.062, gen_loss: 8.196, Ret_loss 8.062, FS_loss 8.229, KL_loss: 3189.166, 
	
2020/191900 (epoch 1) loss: 8.028, gen_loss: 8.205, Ret_loss 8.028, FS_loss 8.259, KL_loss: 4706.781, 
	
2025/191900 (epoch 1) loss: 7.982, gen_loss: 8.207, Ret_loss 7.982, FS_loss 8.283, KL_loss: 7055.786, 
	
2030/191900 (epoch 1) loss: 7.941, gen_loss: 8.214, Ret_loss 7.941, FS_loss 8.311, KL_loss: 10385.814, 
	
2035/191900 (epoch 1) loss: 7.901, gen_loss: 8.222, Ret_loss 7.901, FS_loss 8.340, KL_loss: 15196.203, 
	
2040/191900 (epoch 1) loss: 7.863, gen_loss: 8.229, Ret_loss 7.863, FS_loss 8.368, KL_loss: 22084.683, 
	
2045/191900 (epoch 1) loss: 7.824, gen_loss: 8.239, Ret_loss 7.824, FS_loss 8.399, KL_loss: 32638.753, 
	
2050/191900 (epoch 1) loss: 7.790, gen_loss: 8.252, Ret_loss 7.790, FS_loss 8.433, KL_loss: 48950.327, 
	
2055/191900 (epoch 1) loss: 7.748, gen_loss: 8.258, Ret_loss 7.748, FS_loss 8.461, KL_loss: 74057.728, 
	
2060/191900 (epoch 1) loss: 7.711, gen_loss: 8.266, Ret_loss 7.711, FS_loss 8.490, KL_loss: 112634.959, 
	
2065/191900 (epoch 1) loss: 7.669, gen_loss: 8.274, Ret_loss 7.669, FS_loss 8.519, KL_loss: 179256.386, 
	
2070/191900 (epoch 1) loss: 7.632, gen_loss: 8.285, Ret_loss 7.632, FS_loss 8.550, KL_loss: 288389.701, 
	
2075/191900 (epoch 1) loss: 7.599, gen_loss: 8.299, Ret_loss 7.599, FS_loss 8.585, KL_loss: 483488.844, 
	
2080/191900 (epoch 1) loss: 7.565, gen_loss: 8.309, Ret_loss 7.565, FS_loss 8.614, KL_loss: 812714.806, 
	
2085/191900 (epoch 1) loss: 7.533, gen_loss: 8.321, Ret_loss 7.533, FS_loss 8.646, KL_loss: 1470730.380, 
	
2090/191900 (epoch 1) loss: 7.501, gen_loss: 8.333, Ret_loss 7.501, FS_loss 8.676, KL_loss: 2732805.172, 
	
2095/191900 (epoch 1) loss: 7.468, gen_loss: 8.344, Ret_loss 7.468, FS_loss 8.706, KL_loss: 5393244.573, 
	
2100/191900 (epoch 1) loss: 7.437, gen_loss: 8.355, Ret_loss 7.437, FS_loss 8.733, KL_loss: 11302140.492, 
	
2105/191900 (epoch 1) loss: 7.402, gen_loss: 8.365, Ret_loss 7.402, FS_loss 8.761, KL_loss: 27942265.163, 
	
2110/191900 (epoch 1) loss: 7.371, gen_loss: 8.375, Ret_loss 7.371, FS_loss 8.787, KL_loss: 80562697.675, 
	
2115/191900 (epoch 1) loss: 7.339, gen_loss: 8.386, Ret_loss 7.339, FS_loss 8.816, KL_loss: 353809497.997, 
	
2120/191900 (epoch 1) loss: 7.307, gen_loss: 8.394, Ret_loss 7.307, FS_loss 8.839, KL_loss: 14325358350.265, 
	
2125/191900 (epoch 1) loss: 7.280, gen_loss: 8.406, Ret_loss 7.280, FS_loss 8.867, KL_loss: 3405513775996336.000, 
	
2130/191900 (epoch 1) loss: 7.250, gen_loss: 8.415, Ret_loss 7.250, FS_loss 8.891, KL_loss: 3325198053464722.500, 
	
2135/191900 (epoch 1) loss: 7.225, gen_loss: 8.428, Ret_loss 7.225, FS_loss 8.919, KL_loss: 3248585618394892.500, 
	
2140/191900 (epoch 1) loss: 7.199, gen_loss: 8.442, Ret_loss 7.199, FS_loss 8.947, KL_loss: 3175421993410303.500, 
	
2145/191900 (epoch 1) loss: 7.173, gen_loss: 8.454, Ret_loss 7.173, FS_loss 8.974, KL_loss: 3105479091483180.500, 
	
2150/191900 (epoch 1) loss: 7.146, gen_loss: 8.465, Ret_loss 7.146, FS_loss 8.999, KL_loss: 3038550842980206.000, 
	
2155/191900 (epoch 1) loss: 7.121, gen_loss: 8.475, Ret_loss 7.121, FS_loss 9.023, KL_loss: 2974446544993770.000, 
	
2160/191900 (epoch 1) loss: 7.094, gen_loss: 8.485, Ret_loss 7.094, FS_loss 9.046, KL_loss: 2912991197947673.000, 
	
2165/191900 (epoch 1) loss: 7.069, gen_loss: 8.496, Ret_loss 7.069, FS_loss 9.070, KL_loss: 2854023927388470.500, 
	
2170/191900 (epoch 1) loss: 7.047, gen_loss: 8.507, Ret_loss 7.047, FS_loss 9.092, KL_loss: 2797396642319912.000, 
	
2175/191900 (epoch 1) loss: 7.022, gen_loss: 8.520, Ret_loss 7.022, FS_loss 9.118, KL_loss: 2742972801414390.500, 
	
2180/191900 (epoch 1) loss: 6.997, gen_loss: 8.533, Ret_loss 6.997, FS_loss 9.144, KL_loss: 2690626237421450.500, 
	
2185/191900 (epoch 1) loss: 6.975, gen_loss: 8.545, Ret_loss 6.975, FS_loss 9.168, KL_loss: 2640240259739893.000, 
	
2190/191900 (epoch 1) loss: 6.952, gen_loss: 8.556, Ret_loss 6.952, FS_loss 9.190, KL_loss: 2591706824787049.000, 
	
2195/191900 (epoch 1) loss: 6.928, gen_loss: 8.566, Ret_loss 6.928, FS_loss 9.210, KL_loss: 2544925657434045.000, 
	
2200/191900 (epoch 1) loss: 6.901, gen_loss: 8.576, Ret_loss 6.901, FS_loss 9.232, KL_loss: 2499803774232808.000, 
	
2205/191900 (epoch 1) loss: 6.881, gen_loss: 8.588, Ret_loss 6.881, FS_loss 9.254, KL_loss: 2456254619436606.000, 
	
2210/191900 (epoch 1) loss: 6.857, gen_loss: 8.597, Ret_loss 6.857, FS_loss 9.273, KL_loss: 2414199504328114.500, 
	
2215/191900 (epoch 1) loss: 6.834, gen_loss: 8.607, Ret_loss 6.834, FS_loss 9.292, KL_loss: 2373605231228486.000, 
	
2220/191900 (epoch 1) loss: 6.814, gen_loss: 8.619, Ret_loss 6.814, FS_loss 9.313, KL_loss: 2334307189687894.000, 
	
2225/191900 (epoch 1) loss: 6.792, gen_loss: 8.630, Ret_loss 6.792, FS_loss 9.332, KL_loss: 2296289184121319.500, 
	
2230/191900 (epoch 1) loss: 6.769, gen_loss: 8.643, Ret_loss 6.769, FS_loss 9.355, KL_loss: 2259489702879397.500, 
	
2235/191900 (epoch 1) loss: 6.751, gen_loss: 8.657, Ret_loss 6.751, FS_loss 9.377, KL_loss: 2223851090511600.250, 
	
2240/191900 (epoch 1) loss: 6.728, gen_loss: 8.669, Ret_loss 6.728, FS_loss 9.399, KL_loss: 2189319279064787.000, 
	
2245/191900 (epoch 1) loss: 6.708, gen_loss: 8.682, Ret_loss 6.708, FS_loss 9.420, KL_loss: 2155843506869685.250, 
	
2250/191900 (epoch 1) loss: 6.689, gen_loss: 8.696, Ret_loss 6.689, FS_loss 9.445, KL_loss: 2123376090388872.000, 
	
2255/191900 (epoch 1) loss: 6.669, gen_loss: 8.705, Ret_loss 6.669, FS_loss 9.461, KL_loss: 2091872162213505.500, 
	
2260/191900 (epoch 1) loss: 6.654, gen_loss: 8.716, Ret_loss 6.654, FS_loss 9.481, KL_loss: 2061289565125503.750, 
	
2265/191900 (epoch 1) loss: 6.635, gen_loss: 8.727, Ret_loss 6.635, FS_loss 9.501, KL_loss: 2031588896305326.500, 
	
2270/191900 (epoch 1) loss: 6.616, gen_loss: 8.739, Ret_loss 6.616, FS_loss 9.523, KL_loss: 2002733652572785.750, 
	
2275/191900 (epoch 1) loss: 6.599, gen_loss: 8.751, Ret_loss 6.599, FS_loss 9.543, KL_loss: 1977615613626918.250, 
	
2280/191900 (epoch 1) loss: 6.583, gen_loss: 8.762, Ret_loss 6.583, FS_loss 9.563, KL_loss: 1950300490846093.000, 
	
2285/191900 (epoch 1) loss: 6.567, gen_loss: 8.773, Ret_loss 6.567, FS_loss 9.581, KL_loss: 1923729643343489.000, 
	
2290/191900 (epoch 1) loss: 6.548, gen_loss: 8.783, Ret_loss 6.548, FS_loss 9.599, KL_loss: 1897873065250992.750, 
	
2295/191900 (epoch 1) loss: 6.532, gen_loss: 8.794, Ret_loss 6.532, FS_loss 9.618, KL_loss: 1872702338249933.750, 
	
2300/191900 (epoch 1) loss: 6.515, gen_loss: 8.803, Ret_loss 6.515, FS_loss 9.634, KL_loss: 1848190531401158.000, 
	
2305/191900 (epoch 1) loss: 6.497, gen_loss: 8.811, Ret_loss 6.497, FS_loss 9.649, KL_loss: 1824312106490286.750, 
	
2310/191900 (epoch 1) loss: 6.481, gen_loss: 8.822, Ret_loss 6.481, FS_loss 9.666, KL_loss: 1801042828420251.750, 
	
2315/191900 (epoch 1) loss: 6.465, gen_loss: 8.829, Ret_loss 6.465, FS_loss 9.679, KL_loss: 1778359683670380.750, 
	
2320/191900 (epoch 1) loss: 6.448, gen_loss: 8.836, Ret_loss 6.448, FS_loss 9.692, KL_loss: 1756240808504984.750, 
	
2325/191900 (epoch 1) loss: 6.432, gen_loss: 8.845, Ret_loss 6.432, FS_loss 9.706, KL_loss: 1734665424211845.250, 
	
2330/191900 (epoch 1) loss: 6.415, gen_loss: 8.853, Ret_loss 6.415, FS_loss 9.720, KL_loss: 1713613803125594.000, 
	
2335/191900 (epoch 1) loss: 6.399, gen_loss: 8.862, Ret_loss 6.399, FS_loss 9.734, KL_loss: 1693067254291692.250, 
	
2340/191900 (epoch 1) loss: 6.385, gen_loss: 8.871, Ret_loss 6.385, FS_loss 9.747, KL_loss: 1673008285727562.500, 
	
2345/191900 (epoch 1) loss: 6.370, gen_loss: 8.879, Ret_loss 6.370, FS_loss 9.760, KL_loss: 1653421186198581.250, 
	
2350/191900 (epoch 1) loss: 6.352, gen_loss: 8.887, Ret_loss 6.352, FS_loss 9.773, KL_loss: 1634286038077476.250, 
	
2355/191900 (epoch 1) loss: 6.337, gen_loss: 8.895, Ret_loss 6.337, FS_loss 9.787, KL_loss: 1615587802119140.500, 
	
2360/191900 (epoch 1) loss: 6.320, gen_loss: 8.902, Ret_loss 6.320, FS_loss 9.799, KL_loss: 1597312280154981.250, 
	
2365/191900 (epoch 1) loss: 6.306, gen_loss: 8.910, Ret_loss 6.306, FS_loss 9.812, KL_loss: 1579445491980006.750, 
	
2370/191900 (epoch 1) loss: 6.292, gen_loss: 8.919, Ret_loss 6.292, FS_loss 9.825, KL_loss: 1561973968851472.500, 
	
2375/191900 (epoch 1) loss: 6.278, gen_loss: 8.927, Ret_loss 6.278, FS_loss 9.837, KL_loss: 1544884776373584.750, 
	
2380/191900 (epoch 1) loss: 6.264, gen_loss: 8.936, Ret_loss 6.264, FS_loss 9.851, KL_loss: 1528165578929748.750, 
	
2385/191900 (epoch 1) loss: 6.252, gen_loss: 8.945, Ret_loss 6.252, FS_loss 9.864, KL_loss: 1511804577916509.750, 
	
2390/191900 (epoch 1) loss: 6.240, gen_loss: 8.954, Ret_loss 6.240, FS_loss 9.877, KL_loss: 1495790768474474.750, 
	
2395/191900 (epoch 1) loss: 6.226, gen_loss: 8.963, Ret_loss 6.226, FS_loss 9.891, KL_loss: 1480113104652728.500, 
	
2400/191900 (epoch 1) loss: 6.213, gen_loss: 8.972, Ret_loss 6.213, FS_loss 9.904, KL_loss: 1464760995852830.250, 
	
2405/191900 (epoch 1) loss: 6.201, gen_loss: 8.979, Ret_loss 6.201, FS_loss 9.914, KL_loss: 1449723696238935.250, 
	
2410/191900 (epoch 1) loss: 6.188, gen_loss: 8.988, Ret_loss 6.188, FS_loss 9.928, KL_loss: 1434991659262733.000, 
	
2415/191900 (epoch 1) loss: 6.177, gen_loss: 8.997, Ret_loss 6.177, FS_loss 9.940, KL_loss: 1420555751714979.250, 
	
2420/191900 (epoch 1) loss: 6.164, gen_loss: 9.006, Ret_loss 6.164, FS_loss 9.954, KL_loss: 1406407349500522.500, 
	
2425/191900 (epoch 1) loss: 6.151, gen_loss: 9.014, Ret_loss 6.151, FS_loss 9.965, KL_loss: 1392538018243156.250, 
	
2430/191900 (epoch 1) loss: 6.139, gen_loss: 9.022, Ret_loss 6.139, FS_loss 9.976, KL_loss: 1378939558880334.500, 
	
2435/191900 (epoch 1) loss: 6.126, gen_loss: 9.029, Ret_loss 6.126, FS_loss 9.987, KL_loss: 1365604055176378.750, 
	
2440/191900 (epoch 1) loss: 6.113, gen_loss: 9.038, Ret_loss 6.113, FS_loss 10.000, KL_loss: 1352524066178254.500, 
	
2445/191900 (epoch 1) loss: 6.103, gen_loss: 9.048, Ret_loss 6.103, FS_loss 10.012, KL_loss: 1339692275847928.250, 
	
2450/191900 (epoch 1) loss: 6.092, gen_loss: 9.056, Ret_loss 6.092, FS_loss 10.023, KL_loss: 1327101956350759.000, 
	
2455/191900 (epoch 1) loss: 6.080, gen_loss: 9.062, Ret_loss 6.080, FS_loss 10.032, KL_loss: 1314747142467018.250, 
	
2460/191900 (epoch 1) loss: 6.069, gen_loss: 9.071, Ret_loss 6.069, FS_loss 10.044, KL_loss: 1302623645050410.000, 
	
2465/191900 (epoch 1) loss: 6.057, gen_loss: 9.079, Ret_loss 6.057, FS_loss 10.055, KL_loss: 1290725709356208.500, 
	
2470/191900 (epoch 1) loss: 6.046, gen_loss: 9.087, Ret_loss 6.046, FS_loss 10.065, KL_loss: 1279215637780604.750, 
	
2475/191900 (epoch 1) loss: 6.037, gen_loss: 9.095, Ret_loss 6.037, FS_loss 10.075, KL_loss: 1267737136458465.750, 
	
2480/191900 (epoch 1) loss: 6.027, gen_loss: 9.102, Ret_loss 6.027, FS_loss 10.084, KL_loss: 1256459270233360.000, 
	
2485/191900 (epoch 1) loss: 6.016, gen_loss: 9.110, Ret_loss 6.016, FS_loss 10.093, KL_loss: 1245379731595103.750, 
	
2490/191900 (epoch 1) loss: 6.004, gen_loss: 9.117, Ret_loss 6.004, FS_loss 10.102, KL_loss: 1234493777791279.000, 
	
2495/191900 (epoch 1) loss: 5.994, gen_loss: 9.125, Ret_loss 5.994, FS_loss 10.112, KL_loss: 1223796506027338.500, 
	
2500/191900 (epoch 1) loss: 5.985, gen_loss: 9.135, Ret_loss 5.985, FS_loss 10.124, KL_loss: 1213283138293603.750, 
	
2505/191900 (epoch 1) loss: 5.975, gen_loss: 9.143, Ret_loss 5.975, FS_loss 10.132, KL_loss: 1202949199040810.750, 
	
2510/191900 (epoch 1) loss: 5.965, gen_loss: 9.149, Ret_loss 5.965, FS_loss 10.140, KL_loss: 1192790129554223.250, 
	
2515/191900 (epoch 1) loss: 5.956, gen_loss: 9.156, Ret_loss 5.956, FS_loss 10.148, KL_loss: 1182801714904167.250, 
	
2520/191900 (epoch 1) loss: 5.946, gen_loss: 9.164, Ret_loss 5.946, FS_loss 10.157, KL_loss: 1172978916488187.250, 
	
2525/191900 (epoch 1) loss: 5.936, gen_loss: 9.171, Ret_loss 5.936, FS_loss 10.166, KL_loss: 1163318057838418.750, 
	
2530/191900 (epoch 1) loss: 5.926, gen_loss: 9.179, Ret_loss 5.926, FS_loss 10.175, KL_loss: 1153815304025347.750, 
	
2535/191900 (epoch 1) loss: 5.917, gen_loss: 9.187, Ret_loss 5.917, FS_loss 10.184, KL_loss: 1144467049660972.500, 
	
2540/191900 (epoch 1) loss: 5.908, gen_loss: 9.195, Ret_loss 5.908, FS_loss 10.194, KL_loss: 1135523504598340.750, 
	
2545/191900 (epoch 1) loss: 5.899, gen_loss: 9.202, Ret_loss 5.899, FS_loss 10.202, KL_loss: 1126515621667638.000, 
	
2550/191900 (epoch 1) loss: 5.890, gen_loss: 9.211, Ret_loss 5.890, FS_loss 10.213, KL_loss: 1117603871505834.500, 
	
2555/191900 (epoch 1) loss: 5.882, gen_loss: 9.218, Ret_loss 5.882, FS_loss 10.221, KL_loss: 1108831810960500.125, 
	
2560/191900 (epoch 1) loss: 5.874, gen_loss: 9.225, Ret_loss 5.874, FS_loss 10.230, KL_loss: 1100196409764821.375, 
	
2565/191900 (epoch 1) loss: 5.865, gen_loss: 9.233, Ret_loss 5.865, FS_loss 10.240, KL_loss: 1091694627319420.625, 
	
2570/191900 (epoch 1) loss: 5.855, gen_loss: 9.240, Ret_loss 5.855, FS_loss 10.248, KL_loss: 1083323493358157.375, 
	
2575/191900 (epoch 1) loss: 5.848, gen_loss: 9.247, Ret_loss 5.848, FS_loss 10.257, KL_loss: 1075079792384725.125, 
	
2580/191900 (epoch 1) loss: 5.839, gen_loss: 9.253, Ret_loss 5.839, FS_loss 10.264, KL_loss: 1066960580300402.875, 
	
2585/191900 (epoch 1) loss: 5.830, gen_loss: 9.260, Ret_loss 5.830, FS_loss 10.274, KL_loss: 1058963189543936.375, 
	
2590/191900 (epoch 1) loss: 5.821, gen_loss: 9.265, Ret_loss 5.821, FS_loss 10.281, KL_loss: 1051084823627896.750, 
	
2595/191900 (epoch 1) loss: 5.812, gen_loss: 9.271, Ret_loss 5.812, FS_loss 10.288, KL_loss: 1043322428394562.875, 
	
2600/191900 (epoch 1) loss: 5.802, gen_loss: 9.277, Ret_loss 5.802, FS_loss 10.297, KL_loss: 1035673769731818.625, 
	
2605/191900 (epoch 1) loss: 5.794, gen_loss: 9.285, Ret_loss 5.794, FS_loss 10.307, KL_loss: 1028136444563460.875, 
	
2610/191900 (epoch 1) loss: 5.785, gen_loss: 9.292, Ret_loss 5.785, FS_loss 10.316, KL_loss: 1020708079621184.000, 
	
2615/191900 (epoch 1) loss: 5.776, gen_loss: 9.296, Ret_loss 5.776, FS_loss 10.322, KL_loss: 1013386370648383.125, 
	
2620/191900 (epoch 1) loss: 5.768, gen_loss: 9.302, Ret_loss 5.768, FS_loss 10.330, KL_loss: 1006169261194708.625, 
	
2625/191900 (epoch 1) loss: 5.761, gen_loss: 9.308, Ret_loss 5.761, FS_loss 10.338, KL_loss: 999056135874243.125, 
	
2630/191900 (epoch 1) loss: 5.754, gen_loss: 9.314, Ret_loss 5.754, FS_loss 10.347, KL_loss: 992050592974392.500, 
	
2635/191900 (epoch 1) loss: 5.745, gen_loss: 9.320, Ret_loss 5.745, FS_loss 10.354, KL_loss: 985160928279301.000, 
	
2640/191900 (epoch 1) loss: 5.737, gen_loss: 9.325, Ret_loss 5.737, FS_loss 10.361, KL_loss: 978351528462176.125, 
	
2645/191900 (epoch 1) loss: 5.731, gen_loss: 9.331, Ret_loss 5.731, FS_loss 10.370, KL_loss: 971624616961446.875, 
	
2650/191900 (epoch 1) loss: 5.722, gen_loss: 9.337, Ret_loss 5.722, FS_loss 10.378, KL_loss: 964988513488564.750, 
	
2655/191900 (epoch 1) loss: 5.715, gen_loss: 9.344, Ret_loss 5.715, FS_loss 10.388, KL_loss: 958442320880098.500, 
	
2660/191900 (epoch 1) loss: 5.707, gen_loss: 9.349, Ret_loss 5.707, FS_loss 10.394, KL_loss: 951984274352176.625, 
	
2665/191900 (epoch 1) loss: 5.700, gen_loss: 9.354, Ret_loss 5.700, FS_loss 10.401, KL_loss: 945612730003816.875, 
	
2670/191900 (epoch 1) loss: 5.693, gen_loss: 9.361, Ret_loss 5.693, FS_loss 10.410, KL_loss: 939326120569043.375, 
	
2675/191900 (epoch 1) loss: 5.686, gen_loss: 9.364, Ret_loss 5.686, FS_loss 10.415, KL_loss: 933124833672365.500, 
	
2680/191900 (epoch 1) loss: 5.679, gen_loss: 9.370, Ret_loss 5.679, FS_loss 10.423, KL_loss: 927808102799767.500, 
	
2685/191900 (epoch 1) loss: 5.673, gen_loss: 9.376, Ret_loss 5.673, FS_loss 10.431, KL_loss: 921765557594418.125, 
	
2690/191900 (epoch 1) loss: 5.666, gen_loss: 9.383, Ret_loss 5.666, FS_loss 10.439, KL_loss: 915798260877486.125, 
	
2695/191900 (epoch 1) loss: 5.659, gen_loss: 9.388, Ret_loss 5.659, FS_loss 10.446, KL_loss: 909906910541040.125, 
	
2700/191900 (epoch 1) loss: 5.652, gen_loss: 9.394, Ret_loss 5.652, FS_loss 10.453, KL_loss: 904090709498598.750, 
	
2705/191900 (epoch 1) loss: 5.645, gen_loss: 9.400, Ret_loss 5.645, FS_loss 10.461, KL_loss: 898359453922122.125, 
	
2710/191900 (epoch 1) loss: 5.638, gen_loss: 9.406, Ret_loss 5.638, FS_loss 10.468, KL_loss: 892802307374694.500, 
	
2715/191900 (epoch 1) loss: 5.631, gen_loss: 9.411, Ret_loss 5.631, FS_loss 10.474, KL_loss: 887201349066111.250, 
	
2720/191900 (epoch 1) loss: 5.624, gen_loss: 9.417, Ret_loss 5.624, FS_loss 10.481, KL_loss: 881670204229217.375, 
	
2725/191900 (epoch 1) loss: 5.618, gen_loss: 9.423, Ret_loss 5.618, FS_loss 10.489, KL_loss: 876207599129882.625, 
	
2730/191900 (epoch 1) loss: 5.612, gen_loss: 9.429, Ret_loss 5.612, FS_loss 10.496, KL_loss: 870812282856771.125, 
	
2735/191900 (epoch 1) loss: 5.605, gen_loss: 9.434, Ret_loss 5.605, FS_loss 10.502, KL_loss: 865483054144587.500, 
	
2740/191900 (epoch 1) loss: 5.599, gen_loss: 9.440, Ret_loss 5.599, FS_loss 10.510, KL_loss: 860218828746270.250, 
	
2745/191900 (epoch 1) loss: 5.593, gen_loss: 9.447, Ret_loss 5.593, FS_loss 10.518, KL_loss: 855019782363833.375, 
	
2750/191900 (epoch 1) loss: 5.586, gen_loss: 9.452, Ret_loss 5.586, FS_loss 10.523, KL_loss: 849897299665375.125, 
	
2755/191900 (epoch 1) loss: 5.579, gen_loss: 9.457, Ret_loss 5.579, FS_loss 10.529, KL_loss: 844820583450772.375, 
	
2760/191900 (epoch 1) loss: 5.572, gen_loss: 9.463, Ret_loss 5.572, FS_loss 10.535, KL_loss: 839803938560092.750, 
	
2765/191900 (epoch 1) loss: 5.566, gen_loss: 9.468, Ret_loss 5.566, FS_loss 10.541, KL_loss: 834846495748521.875, 
	
2770/191900 (epoch 1) loss: 5.559, gen_loss: 9.473, Ret_loss 5.559, FS_loss 10.547, KL_loss: 829947248733617.000, 
	
2775/191900 (epoch 1) loss: 5.553, gen_loss: 9.480, Ret_loss 5.553, FS_loss 10.554, KL_loss: 825105212544958.625, 
	
2780/191900 (epoch 1) loss: 5.547, gen_loss: 9.485, Ret_loss 5.547, FS_loss 10.559, KL_loss: 820319442910936.500, 
	
2785/191900 (epoch 1) loss: 5.541, gen_loss: 9.492, Ret_loss 5.541, FS_loss 10.566, KL_loss: 815589519337780.500, 
	
2790/191900 (epoch 1) loss: 5.535, gen_loss: 9.497, Ret_loss 5.535, FS_loss 10.572, KL_loss: 810929879559519.375, 
	
2795/191900 (epoch 1) loss: 5.529, gen_loss: 9.502, Ret_loss 5.529, FS_loss 10.577, KL_loss: 806309555953079.375, 
	
2800/191900 (epoch 1) loss: 5.523, gen_loss: 9.508, Ret_loss 5.523, FS_loss 10.583, KL_loss: 801746454771571.750, 
	
2805/191900 (epoch 1) loss: 5.517, gen_loss: 9.513, Ret_loss 5.517, FS_loss 10.587, KL_loss: 797236979279610.250, 
	
2810/191900 (epoch 1) loss: 5.511, gen_loss: 9.518, Ret_loss 5.511, FS_loss 10.593, KL_loss: 792773376571276.375, 
	
2815/191900 (epoch 1) loss: 5.505, gen_loss: 9.523, Ret_loss 5.505, FS_loss 10.598, KL_loss: 788364397951840.500, 
	
2820/191900 (epoch 1) loss: 5.499, gen_loss: 9.527, Ret_loss 5.499, FS_loss 10.602, KL_loss: 783998188890919.500, 
	
2825/191900 (epoch 1) loss: 5.493, gen_loss: 9.532, Ret_loss 5.493, FS_loss 10.606, KL_loss: 779682371042825.875, 
	
2830/191900 (epoch 1) loss: 5.488, gen_loss: 9.536, Ret_loss 5.488, FS_loss 10.611, KL_loss: 775423265086386.750, 
	
2835/191900 (epoch 1) loss: 5.481, gen_loss: 9.541, Ret_loss 5.481, FS_loss 10.616, KL_loss: 771195513566000.625, 
	
2840/191900 (epoch 1) loss: 5.476, gen_loss: 9.546, Ret_loss 5.476, FS_loss 10.621, KL_loss: 767013519831181.375, 
	
2845/191900 (epoch 1) loss: 5.469, gen_loss: 9.552, Ret_loss 5.469, FS_loss 10.626, KL_loss: 762876697276114.750, 
	
2850/191900 (epoch 1) loss: 5.464, gen_loss: 9.558, Ret_loss 5.464, FS_loss 10.632, KL_loss: 758784309531168.125, 
	
2855/191900 (epoch 1) loss: 5.458, gen_loss: 9.563, Ret_loss 5.458, FS_loss 10.638, KL_loss: 754735707499450.375, 
	
2860/191900 (epoch 1) loss: 5.453, gen_loss: 9.569, Ret_loss 5.453, FS_loss 10.644, KL_loss: 750730369440369.375, 
	
2865/191900 (epoch 1) loss: 5.448, gen_loss: 9.573, Ret_loss 5.448, FS_loss 10.648, KL_loss: 746786456607551.750, 
	
2870/191900 (epoch 1) loss: 5.443, gen_loss: 9.578, Ret_loss 5.443, FS_loss 10.653, KL_loss: 742865737307660.125, 
	
2875/191900 (epoch 1) loss: 5.438, gen_loss: 9.583, Ret_loss 5.438, FS_loss 10.658, KL_loss: 738984638826779.875, 
	
2880/191900 (epoch 1) loss: 5.433, gen_loss: 9.589, Ret_loss 5.433, FS_loss 10.664, KL_loss: 735143855433301.375, 
	
2885/191900 (epoch 1) loss: 5.427, gen_loss: 9.594, Ret_loss 5.427, FS_loss 10.670, KL_loss: 731342809606914.125, 
	
2890/191900 (epoch 1) loss: 5.422, gen_loss: 9.599, Ret_loss 5.422, FS_loss 10.675, KL_loss: 727580950874998.250, 
	
2895/191900 (epoch 1) loss: 5.417, gen_loss: 9.604, Ret_loss 5.417, FS_loss 10.681, KL_loss: 723857895693725.250, 
	
2900/191900 (epoch 1) loss: 5.411, gen_loss: 9.610, Ret_loss 5.411, FS_loss 10.687, KL_loss: 720173266024228.250, 
	
2905/191900 (epoch 1) loss: 5.405, gen_loss: 9.615, Ret_loss 5.405, FS_loss 10.693, KL_loss: 716525886423074.500, 
	
2910/191900 (epoch 1) loss: 5.399, gen_loss: 9.620, Ret_loss 5.399, FS_loss 10.698, KL_loss: 712915140095596.625, 
	
2915/191900 (epoch 1) loss: 5.394, gen_loss: 9.624, Ret_loss 5.394, FS_loss 10.703, KL_loss: 709341118028116.250, 
	
2920/191900 (epoch 1) loss: 5.390, gen_loss: 9.630, Ret_loss 5.390, FS_loss 10.708, KL_loss: 705803111792469.625, 
	
2925/191900 (epoch 1) loss: 5.384, gen_loss: 9.634, Ret_loss 5.384, FS_loss 10.713, KL_loss: 702301019695123.625, 
	
2930/191900 (epoch 1) loss: 5.378, gen_loss: 9.639, Ret_loss 5.378, FS_loss 10.719, KL_loss: 698840063434389.000, 
	
2935/191900 (epoch 1) loss: 5.373, gen_loss: 9.644, Ret_loss 5.373, FS_loss 10.724, KL_loss: 695406903903747.750, 
	
2940/191900 (epoch 1) loss: 5.368, gen_loss: 9.648, Ret_loss 5.368, FS_loss 10.729, KL_loss: 692005095233729.625, 
	
2945/191900 (epoch 1) loss: 5.363, gen_loss: 9.652, Ret_loss 5.363, FS_loss 10.733, KL_loss: 688636281581932.125, 
	
2950/191900 (epoch 1) loss: 5.358, gen_loss: 9.657, Ret_loss 5.358, FS_loss 10.738, KL_loss: 685300181423295.750, 
	
2955/191900 (epoch 1) loss: 5.354, gen_loss: 9.661, Ret_loss 5.354, FS_loss 10.743, KL_loss: 681996278202021.625, 
	
2960/191900 (epoch 1) loss: 5.349, gen_loss: 9.666, Ret_loss 5.349, FS_loss 10.748, KL_loss: 678724217365314.625, 
	
2965/191900 (epoch 1) loss: 5.343, gen_loss: 9.670, Ret_loss 5.343, FS_loss 10.753, KL_loss: 675484147931080.500, 
	
2970/191900 (epoch 1) loss: 5.339, gen_loss: 9.674, Ret_loss 5.339, FS_loss 10.758, KL_loss: 672278472385447.625, 
	
2975/191900 (epoch 1) loss: 5.334, gen_loss: 9.679, Ret_loss 5.334, FS_loss 10.763, KL_loss: 669114384776566.250, 
	
2980/191900 (epoch 1) loss: 5.328, gen_loss: 9.683, Ret_loss 5.328, FS_loss 10.768, KL_loss: 665964916923483.875, 
	
2985/191900 (epoch 1) loss: 5.324, gen_loss: 9.689, Ret_loss 5.324, FS_loss 10.774, KL_loss: 662844426463250.500, 
	
2990/191900 (epoch 1) loss: 5.319, gen_loss: 9.693, Ret_loss 5.319, FS_loss 10.779, KL_loss: 659753015277683.875, 
	
2995/191900 (epoch 1) loss: 5.314, gen_loss: 9.697, Ret_loss 5.314, FS_loss 10.784, KL_loss: 656690381089638.250, 
	
3000/191900 (epoch 1) loss: 5.309, gen_loss: 9.701, Ret_loss 5.309, FS_loss 10.789, KL_loss: 653656230498150.000, 
	
3005/191900 (epoch 1) loss: 5.305, gen_loss: 9.705, Ret_loss 5.305, FS_loss 10.793, KL_loss: 650650231876864.500, 
	
3010/191900 (epoch 1) loss: 5.300, gen_loss: 9.710, Ret_loss 5.300, FS_loss 10.799, KL_loss: 647672521869594.500, 
	
3015/191900 (epoch 1) loss: 5.296, gen_loss: 9.714, Ret_loss 5.296, FS_loss 10.804, KL_loss: 644761707775719.250, 
	
3020/191900 (epoch 1) loss: 5.291, gen_loss: 9.718, Ret_loss 5.291, FS_loss 10.810, KL_loss: 641836766820728.625, 
	
3025/191900 (epoch 1) loss: 5.286, gen_loss: 9.722, Ret_loss 5.286, FS_loss 10.815, KL_loss: 638938050684971.750, 
	
3030/191900 (epoch 1) loss: 5.282, gen_loss: 9.728, Ret_loss 5.282, FS_loss 10.821, KL_loss: 636065444467934.125, 
	
3035/191900 (epoch 1) loss: 5.278, gen_loss: 9.733, Ret_loss 5.278, FS_loss 10.827, KL_loss: 633218625283156.625, 
	
3040/191900 (epoch 1) loss: 5.273, gen_loss: 9.737, Ret_loss 5.273, FS_loss 10.833, KL_loss: 630397217842058.500, 
	
3045/191900 (epoch 1) loss: 5.269, gen_loss: 9.742, Ret_loss 5.269, FS_loss 10.839, KL_loss: 627601654652107.750, 
	
3050/191900 (epoch 1) loss: 5.264, gen_loss: 9.746, Ret_loss 5.264, FS_loss 10.843, KL_loss: 624846435298171.250, 
	
3055/191900 (epoch 1) loss: 5.259, gen_loss: 9.750, Ret_loss 5.259, FS_loss 10.848, KL_loss: 622100258838581.375, 
	
3060/191900 (epoch 1) loss: 5.255, gen_loss: 9.754, Ret_loss 5.255, FS_loss 10.854, KL_loss: 619376883883757.000, 
	
3065/191900 (epoch 1) loss: 5.251, gen_loss: 9.759, Ret_loss 5.251, FS_loss 10.860, KL_loss: 616677106665967.750, 
	
3070/191900 (epoch 1) loss: 5.247, gen_loss: 9.764, Ret_loss 5.247, FS_loss 10.866, KL_loss: 614000875865188.625, 
	
3075/191900 (epoch 1) loss: 5.242, gen_loss: 9.768, Ret_loss 5.242, FS_loss 10.871, KL_loss: 611348258998929.750, 
	
3080/191900 (epoch 1) loss: 5.238, gen_loss: 9.772, Ret_loss 5.238, FS_loss 10.876, KL_loss: 609097994383995.625, 
	
3085/191900 (epoch 1) loss: 5.233, gen_loss: 9.776, Ret_loss 5.233, FS_loss 10.881, KL_loss: 606488349556764.500, 
	
3090/191900 (epoch 1) loss: 5.229, gen_loss: 9.780, Ret_loss 5.229, FS_loss 10.886, KL_loss: 603900951136126.875, 
	
3095/191900 (epoch 1) loss: 5.225, gen_loss: 9.783, Ret_loss 5.225, FS_loss 10.891, KL_loss: 601335536092492.625, 
	
3100/191900 (epoch 1) loss: 5.220, gen_loss: 9.787, Ret_loss 5.220, FS_loss 10.896, KL_loss: 598791835903346.250, 
	
3105/191900 (epoch 1) loss: 5.216, gen_loss: 9.792, Ret_loss 5.216, FS_loss 10.901, KL_loss: 596269646618351.750, 
	
3110/191900 (epoch 1) loss: 5.212, gen_loss: 9.796, Ret_loss 5.212, FS_loss 10.907, KL_loss: 593982174319255.500, 
	
3115/191900 (epoch 1) loss: 5.208, gen_loss: 9.799, Ret_loss 5.208, FS_loss 10.911, KL_loss: 591501708916652.500, 
	
3120/191900 (epoch 1) loss: 5.204, gen_loss: 9.803, Ret_loss 5.204, FS_loss 10.917, KL_loss: 589041438666094.625, 
	
3125/191900 (epoch 1) loss: 5.200, gen_loss: 9.807, Ret_loss 5.200, FS_loss 10.922, KL_loss: 586601576362035.250, 
	
3130/191900 (epoch 1) loss: 5.196, gen_loss: 9.812, Ret_loss 5.196, FS_loss 10.928, KL_loss: 584182115563439.250, 
	
3135/191900 (epoch 1) loss: 5.192, gen_loss: 9.816, Ret_loss 5.192, FS_loss 10.933, KL_loss: 581783016025597.375, 
	
3140/191900 (epoch 1) loss: 5.189, gen_loss: 9.820, Ret_loss 5.189, FS_loss 10.939, KL_loss: 579405582202334.000, 
	
3145/191900 (epoch 1) loss: 5.184, gen_loss: 9.825, Ret_loss 5.184, FS_loss 10.944, KL_loss: 577045414016268.250, 
	
3150/191900 (epoch 1) loss: 5.179, gen_loss: 9.830, Ret_loss 5.179, FS_loss 10.951, KL_loss: 574703791194634.250, 
	
3155/191900 (epoch 1) loss: 5.175, gen_loss: 9.835, Ret_loss 5.175, FS_loss 10.957, KL_loss: 572381067891128.750, 
	
3160/191900 (epoch 1) loss: 5.172, gen_loss: 9.838, Ret_loss 5.172, FS_loss 10.962, KL_loss: 570077158399842.000, 
	
3165/191900 (epoch 1) loss: 5.168, gen_loss: 9.842, Ret_loss 5.168, FS_loss 10.967, KL_loss: 567791749177988.125, 
	
3170/191900 (epoch 1) loss: 5.163, gen_loss: 9.845, Ret_loss 5.163, FS_loss 10.972, KL_loss: 565524795684988.625, 
	
3175/191900 (epoch 1) loss: 5.159, gen_loss: 9.850, Ret_loss 5.159, FS_loss 10.979, KL_loss: 563276871939928.500, 
	
3180/191900 (epoch 1) loss: 5.155, gen_loss: 9.853, Ret_loss 5.155, FS_loss 10.984, KL_loss: 561071696457345.312, 
	
3185/191900 (epoch 1) loss: 5.152, gen_loss: 9.857, Ret_loss 5.152, FS_loss 10.989, KL_loss: 558859101076935.312, 
	
3190/191900 (epoch 1) loss: 5.147, gen_loss: 9.862, Ret_loss 5.147, FS_loss 10.995, KL_loss: 556662698007223.875, 
	
3195/191900 (epoch 1) loss: 5.143, gen_loss: 9.866, Ret_loss 5.143, FS_loss 11.002, KL_loss: 554483334607092.062, 
	
3200/191900 (epoch 1) loss: 5.139, gen_loss: 9.869, Ret_loss 5.139, FS_loss 11.006, KL_loss: 552321022120524.188, 
	
3205/191900 (epoch 1) loss: 5.136, gen_loss: 9.873, Ret_loss 5.136, FS_loss 11.012, KL_loss: 550175890869473.438, 
	
3210/191900 (epoch 1) loss: 5.132, gen_loss: 9.877, Ret_loss 5.132, FS_loss 11.017, KL_loss: 548048032082281.688, 
	
3215/191900 (epoch 1) loss: 5.129, gen_loss: 9.881, Ret_loss 5.129, FS_loss 11.024, KL_loss: 545937891156631.500, 
	
3220/191900 (epoch 1) loss: 5.125, gen_loss: 9.885, Ret_loss 5.125, FS_loss 11.030, KL_loss: 543844298880253.562, 
	
3225/191900 (epoch 1) loss: 5.122, gen_loss: 9.888, Ret_loss 5.122, FS_loss 11.036, KL_loss: 541765421480542.688, 
	
3230/191900 (epoch 1) loss: 5.118, gen_loss: 9.892, Ret_loss 5.118, FS_loss 11.042, KL_loss: 539701413639605.375, 
	
3235/191900 (epoch 1) loss: 5.114, gen_loss: 9.896, Ret_loss 5.114, FS_loss 11.049, KL_loss: 537653112613211.062, 
	
3240/191900 (epoch 1) loss: 5.110, gen_loss: 9.900, Ret_loss 5.110, FS_loss 11.056, KL_loss: 535620569633604.812, 
	
3245/191900 (epoch 1) loss: 5.106, gen_loss: 9.904, Ret_loss 5.106, FS_loss 11.062, KL_loss: 534222987322004.812, 
	
3250/191900 (epoch 1) loss: 5.102, gen_loss: 9.907, Ret_loss 5.102, FS_loss 11.069, KL_loss: 532239893556196.625, 
	
3255/191900 (epoch 1) loss: 5.099, gen_loss: 9.910, Ret_loss 5.099, FS_loss 11.074, KL_loss: 530249638807072.812, 
	
3260/191900 (epoch 1) loss: 5.095, gen_loss: 9.913, Ret_loss 5.095, FS_loss 11.079, KL_loss: 528274162965869.000, 
	
3265/191900 (epoch 1) loss: 5.092, gen_loss: 9.917, Ret_loss 5.092, FS_loss 11.087, KL_loss: 526313438389981.875, 
	
3270/191900 (epoch 1) loss: 5.088, gen_loss: 9.920, Ret_loss 5.088, FS_loss 11.093, KL_loss: 524367873318494.188, 
	
3275/191900 (epoch 1) loss: 5.084, gen_loss: 9.923, Ret_loss 5.084, FS_loss 11.099, KL_loss: 522441860696883.812, 
	
3280/191900 (epoch 1) loss: 5.080, gen_loss: 9.926, Ret_loss 5.080, FS_loss 11.105, KL_loss: 520524221021964.688, 
	
3285/191900 (epoch 1) loss: 5.076, gen_loss: 9.930, Ret_loss 5.076, FS_loss 11.112, KL_loss: 518620600907936.562, 
	
3290/191900 (epoch 1) loss: 5.073, gen_loss: 9.933, Ret_loss 5.073, FS_loss 11.118, KL_loss: 516731281591311.188, 
	
3295/191900 (epoch 1) loss: 5.070, gen_loss: 9.937, Ret_loss 5.070, FS_loss 11.125, KL_loss: 515401878396630.812, 
	
3300/191900 (epoch 1) loss: 5.066, gen_loss: 9.940, Ret_loss 5.066, FS_loss 11.131, KL_loss: 513537198360546.250, 
	
3305/191900 (epoch 1) loss: 5.063, gen_loss: 9.944, Ret_loss 5.063, FS_loss 11.137, KL_loss: 511685949282608.938, 
	
3310/191900 (epoch 1) loss: 5.059, gen_loss: 9.946, Ret_loss 5.059, FS_loss 11.142, KL_loss: 509848000750481.812, 
	
3315/191900 (epoch 1) loss: 5.056, gen_loss: 9.951, Ret_loss 5.056, FS_loss 11.149, KL_loss: 508023233471635.125, 
	
3320/191900 (epoch 1) loss: 5.053, gen_loss: 9.955, Ret_loss 5.053, FS_loss 11.156, KL_loss: 506212538852413.188, 
	
3325/191900 (epoch 1) loss: 5.050, gen_loss: 9.959, Ret_loss 5.050, FS_loss 11.163, KL_loss: 504413677451255.812, 
	
3330/191900 (epoch 1) loss: 5.046, gen_loss: 9.962, Ret_loss 5.046, FS_loss 11.169, KL_loss: 502627543448651.250, 
	
3335/191900 (epoch 1) loss: 5.042, gen_loss: 9.965, Ret_loss 5.042, FS_loss 11.176, KL_loss: 500854048392517.000, 
	
3340/191900 (epoch 1) loss: 5.038, gen_loss: 9.969, Ret_loss 5.038, FS_loss 11.182, KL_loss: 499093536227819.688, 
	
3345/191900 (epoch 1) loss: 5.035, gen_loss: 9.972, Ret_loss 5.035, FS_loss 11.188, KL_loss: 497357446967263.500, 
	
3350/191900 (epoch 1) loss: 5.032, gen_loss: 9.975, Ret_loss 5.032, FS_loss 11.195, KL_loss: 495620933554230.188, 
	
3355/191900 (epoch 1) loss: 5.028, gen_loss: 9.979, Ret_loss 5.028, FS_loss 11.201, KL_loss: 493896488281865.250, 
	
3360/191900 (epoch 1) loss: 5.025, gen_loss: 9.983, Ret_loss 5.025, FS_loss 11.209, KL_loss: 492184084254876.062, 
	
3365/191900 (epoch 1) loss: 5.021, gen_loss: 9.986, Ret_loss 5.021, FS_loss 11.215, KL_loss: 490484744988755.312, 
	
3370/191900 (epoch 1) loss: 5.018, gen_loss: 9.990, Ret_loss 5.018, FS_loss 11.223, KL_loss: 488811457800916.812, 
	
3375/191900 (epoch 1) loss: 5.014, gen_loss: 9.994, Ret_loss 5.014, FS_loss 11.229, KL_loss: 487134069451430.750, 
	
3380/191900 (epoch 1) loss: 5.012, gen_loss: 9.997, Ret_loss 5.012, FS_loss 11.236, KL_loss: 485468143401595.812, 
	
3385/191900 (epoch 1) loss: 5.009, gen_loss: 10.000, Ret_loss 5.009, FS_loss 11.242, KL_loss: 483813731569031.438, 
	
3390/191900 (epoch 1) loss: 5.005, gen_loss: 10.003, Ret_loss 5.005, FS_loss 11.248, KL_loss: 482194108657898.938, 
	
3395/191900 (epoch 1) loss: 5.002, gen_loss: 10.007, Ret_loss 5.002, FS_loss 11.254, KL_loss: 480562127240046.938, 
	
3400/191900 (epoch 1) loss: 4.999, gen_loss: 10.010, Ret_loss 4.999, FS_loss 11.260, KL_loss: 478940856107467.312, 
	
3405/191900 (epoch 1) loss: 4.996, gen_loss: 10.013, Ret_loss 4.996, FS_loss 11.267, KL_loss: 477330521729812.312, 
	
3410/191900 (epoch 1) loss: 4.993, gen_loss: 10.017, Ret_loss 4.993, FS_loss 11.273, KL_loss: 475731923132832.438, 
	
3415/191900 (epoch 1) loss: 4.989, gen_loss: 10.020, Ret_loss 4.989, FS_loss 11.279, KL_loss: 474149985313626.312, 
	
3420/191900 (epoch 1) loss: 4.986, gen_loss: 10.022, Ret_loss 4.986, FS_loss 11.284, KL_loss: 472571724494948.062, 
	
3425/191900 (epoch 1) loss: 4.983, gen_loss: 10.025, Ret_loss 4.983, FS_loss 11.289, KL_loss: 471003904475007.375, 
	
3430/191900 (epoch 1) loss: 4.979, gen_loss: 10.028, Ret_loss 4.979, FS_loss 11.295, KL_loss: 469446583959304.625, 
	
3435/191900 (epoch 1) loss: 4.976, gen_loss: 10.032, Ret_loss 4.976, FS_loss 11.302, KL_loss: 467904370787245.500, 
	
3440/191900 (epoch 1) loss: 4.973, gen_loss: 10.034, Ret_loss 4.973, FS_loss 11.306, KL_loss: 466369939052839.188, 
	
3445/191900 (epoch 1) loss: 4.970, gen_loss: 10.037, Ret_loss 4.970, FS_loss 11.311, KL_loss: 464844522058864.500, 
	
3450/191900 (epoch 1) loss: 4.967, gen_loss: 10.040, Ret_loss 4.967, FS_loss 11.317, KL_loss: 463328184498610.938, 
	
3455/191900 (epoch 1) loss: 4.963, gen_loss: 10.043, Ret_loss 4.963, FS_loss 11.323, KL_loss: 461821616396147.250, 
	
3460/191900 (epoch 1) loss: 4.960, gen_loss: 10.045, Ret_loss 4.960, FS_loss 11.329, KL_loss: 460324457670214.250, 
	
3465/191900 (epoch 1) loss: 4.958, gen_loss: 10.048, Ret_loss 4.958, FS_loss 11.334, KL_loss: 458837089104543.688, 
	
3470/191900 (epoch 1) loss: 4.955, gen_loss: 10.051, Ret_loss 4.955, FS_loss 11.339, KL_loss: 457359813964680.438, 
	
3475/191900 (epoch 1) loss: 4.951, gen_loss: 10.053, Ret_loss 4.951, FS_loss 11.344, KL_loss: 455891885748623.062, 
	
3480/191900 (epoch 1) loss: 4.949, gen_loss: 10.055, Ret_loss 4.949, FS_loss 11.349, KL_loss: 454433288989043.562, 
	
3485/191900 (epoch 1) loss: 4.946, gen_loss: 10.058, Ret_loss 4.946, FS_loss 11.355, KL_loss: 452985155847520.688, 
	
3490/191900 (epoch 1) loss: 4.943, gen_loss: 10.061, Ret_loss 4.943, FS_loss 11.361, KL_loss: 451544991245295.562, 
	
3495/191900 (epoch 1) loss: 4.941, gen_loss: 10.063, Ret_loss 4.941, FS_loss 11.365, KL_loss: 450113942067182.312, 
	
3500/191900 (epoch 1) loss: 4.937, gen_loss: 10.066, Ret_loss 4.937, FS_loss 11.370, KL_loss: 448692348166585.938, 
	
3505/191900 (epoch 1) loss: 4.935, gen_loss: 10.068, Ret_loss 4.935, FS_loss 11.374, KL_loss: 447279535629373.812, 
	
3510/191900 (epoch 1) loss: 4.931, gen_loss: 10.070, Ret_loss 4.931, FS_loss 11.379, KL_loss: 445880117388444.125, 
	
3515/191900 (epoch 1) loss: 4.928, gen_loss: 10.072, Ret_loss 4.928, FS_loss 11.383, KL_loss: 444567646197763.062, 
	
3520/191900 (epoch 1) loss: 4.926, gen_loss: 10.074, Ret_loss 4.926, FS_loss 11.388, KL_loss: 443180117586948.938, 
	
3525/191900 (epoch 1) loss: 4.923, gen_loss: 10.076, Ret_loss 4.923, FS_loss 11.392, KL_loss: 441801230215615.812, 
	
3530/191900 (epoch 1) loss: 4.920, gen_loss: 10.078, Ret_loss 4.920, FS_loss 11.398, KL_loss: 440431275207152.625, 
	
3535/191900 (epoch 1) loss: 4.917, gen_loss: 10.080, Ret_loss 4.917, FS_loss 11.403, KL_loss: 439189003688029.250, 
	
3540/191900 (epoch 1) loss: 4.915, gen_loss: 10.082, Ret_loss 4.915, FS_loss 11.407, KL_loss: 437835162894360.125, 
	
3545/191900 (epoch 1) loss: 4.912, gen_loss: 10.084, Ret_loss 4.912, FS_loss 11.412, KL_loss: 436489643789702.062, 
	
3550/191900 (epoch 1) loss: 4.909, gen_loss: 10.086, Ret_loss 4.909, FS_loss 11.417, KL_loss: 435152410291702.125, 
	
3555/191900 (epoch 1) loss: 4.906, gen_loss: 10.088, Ret_loss 4.906, FS_loss 11.422, KL_loss: 433824945072885.062, 
	
3560/191900 (epoch 1) loss: 4.902, gen_loss: 10.090, Ret_loss 4.902, FS_loss 11.427, KL_loss: 432503990475552.875, 
	
3565/191900 (epoch 1) loss: 4.899, gen_loss: 10.093, Ret_loss 4.899, FS_loss 11.432, KL_loss: 431191038769107.375, 
	
3570/191900 (epoch 1) loss: 4.896, gen_loss: 10.094, Ret_loss 4.896, FS_loss 11.437, KL_loss: 429886188370145.812, 
	
3575/191900 (epoch 1) loss: 4.894, gen_loss: 10.097, Ret_loss 4.894, FS_loss 11.441, KL_loss: 428594666973279.312, 
	
3580/191900 (epoch 1) loss: 4.891, gen_loss: 10.099, Ret_loss 4.891, FS_loss 11.446, KL_loss: 427305361119185.312, 
	
3585/191900 (epoch 1) loss: 4.889, gen_loss: 10.101, Ret_loss 4.889, FS_loss 11.450, KL_loss: 426023780458496.125, 
	
3590/191900 (epoch 1) loss: 4.885, gen_loss: 10.103, Ret_loss 4.885, FS_loss 11.455, KL_loss: 424750149142435.062, 
	
3595/191900 (epoch 1) loss: 4.882, gen_loss: 10.105, Ret_loss 4.882, FS_loss 11.459, KL_loss: 425647338939286.500, 
	
3600/191900 (epoch 1) loss: 4.880, gen_loss: 10.107, Ret_loss 4.880, FS_loss 11.464, KL_loss: 424387174087861.562, 
	
3605/191900 (epoch 1) loss: 4.877, gen_loss: 10.108, Ret_loss 4.877, FS_loss 11.468, KL_loss: 423130635074608.125, 
	
3610/191900 (epoch 1) loss: 4.874, gen_loss: 10.110, Ret_loss 4.874, FS_loss 11.472, KL_loss: 421881287501688.562, 
	
3615/191900 (epoch 1) loss: 4.871, gen_loss: 10.113, Ret_loss 4.871, FS_loss 11.477, KL_loss: 440330949750859.000, 
	
3620/191900 (epoch 1) loss: 4.869, gen_loss: 10.115, Ret_loss 4.869, FS_loss 11.482, KL_loss: 439037381503933.438, 
	
3625/191900 (epoch 1) loss: 4.866, gen_loss: 10.117, Ret_loss 4.866, FS_loss 11.486, KL_loss: 437751390515583.375, 
	
3630/191900 (epoch 1) loss: 4.864, gen_loss: 10.119, Ret_loss 4.864, FS_loss 11.491, KL_loss: 436472911344345.938, 
	
3635/191900 (epoch 1) loss: 4.861, gen_loss: 10.121, Ret_loss 4.861, FS_loss 11.495, KL_loss: 435201889071262.625, 
	
3640/191900 (epoch 1) loss: 4.858, gen_loss: 10.123, Ret_loss 4.858, FS_loss 11.500, KL_loss: 433938347549030.750, 
	
3645/191900 (epoch 1) loss: 4.856, gen_loss: 10.125, Ret_loss 4.856, FS_loss 11.504, KL_loss: 432682013501777.812, 
	
3650/191900 (epoch 1) loss: 4.852, gen_loss: 10.126, Ret_loss 4.852, FS_loss 11.508, KL_loss: 431432933730720.562, 
	
3655/191900 (epoch 1) loss: 4.850, gen_loss: 10.129, Ret_loss 4.850, FS_loss 11.513, KL_loss: 430191063442652.125, 
	
3660/191900 (epoch 1) loss: 4.847, gen_loss: 10.130, Ret_loss 4.847, FS_loss 11.517, KL_loss: 429067308217626.938, 
	
3665/191900 (epoch 1) loss: 4.844, gen_loss: 10.132, Ret_loss 4.844, FS_loss 11.522, KL_loss: 427839300432118.625, 
	
3670/191900 (epoch 1) loss: 4.841, gen_loss: 10.134, Ret_loss 4.841, FS_loss 11.527, KL_loss: 426618302124179.125, 
	
3675/191900 (epoch 1) loss: 4.839, gen_loss: 10.136, Ret_loss 4.839, FS_loss 11.531, KL_loss: 425404267829990.062, 
	
3680/191900 (epoch 1) loss: 4.836, gen_loss: 10.137, Ret_loss 4.836, FS_loss 11.535, KL_loss: 424198135059577.625, 
	
3685/191900 (epoch 1) loss: 4.833, gen_loss: 10.139, Ret_loss 4.833, FS_loss 11.540, KL_loss: 422997831988903.062, 
	
3690/191900 (epoch 1) loss: 4.831, gen_loss: 10.141, Ret_loss 4.831, FS_loss 11.545, KL_loss: 421804294586319.875, 
	
3695/191900 (epoch 1) loss: 4.828, gen_loss: 10.142, Ret_loss 4.828, FS_loss 11.549, KL_loss: 420617524731434.188, 
	
3700/191900 (epoch 1) loss: 4.825, gen_loss: 10.145, Ret_loss 4.825, FS_loss 11.554, KL_loss: 419449350425162.562, 
	
3705/191900 (epoch 1) loss: 4.823, gen_loss: 10.146, Ret_loss 4.823, FS_loss 11.558, KL_loss: 418275832764392.375, 
	
3710/191900 (epoch 1) loss: 4.820, gen_loss: 10.148, Ret_loss 4.820, FS_loss 11.563, KL_loss: 417108810714822.688, 
	
3715/191900 (epoch 1) loss: 4.818, gen_loss: 10.150, Ret_loss 4.818, FS_loss 11.567, KL_loss: 415948328949319.938, 
	
3720/191900 (epoch 1) loss: 4.816, gen_loss: 10.152, Ret_loss 4.816, FS_loss 11.572, KL_loss: 414802813362022.438, 
	
3725/191900 (epoch 1) loss: 4.814, gen_loss: 10.154, Ret_loss 4.814, FS_loss 11.577, KL_loss: 413656239061427.062, 
	
3730/191900 (epoch 1) loss: 4.812, gen_loss: 10.155, Ret_loss 4.812, FS_loss 11.581, KL_loss: 412514919480180.812, 
	
3735/191900 (epoch 1) loss: 4.809, gen_loss: 10.157, Ret_loss 4.809, FS_loss 11.585, KL_loss: 411379890759945.875, 
	
3740/191900 (epoch 1) loss: 4.807, gen_loss: 10.159, Ret_loss 4.807, FS_loss 11.590, KL_loss: 410251300301639.500, 
	
3745/191900 (epoch 1) loss: 4.805, gen_loss: 10.161, Ret_loss 4.805, FS_loss 11.595, KL_loss: 409130900222955.125, 
	
3750/191900 (epoch 1) loss: 4.802, gen_loss: 10.163, Ret_loss 4.802, FS_loss 11.599, KL_loss: 408061460240760.625, 
	
3755/191900 (epoch 1) loss: 4.799, gen_loss: 10.164, Ret_loss 4.799, FS_loss 11.603, KL_loss: 406951447783521.938, 
	
3760/191900 (epoch 1) loss: 4.796, gen_loss: 10.166, Ret_loss 4.796, FS_loss 11.608, KL_loss: 405847101510566.938, 
	
3765/191900 (epoch 1) loss: 4.794, gen_loss: 10.168, Ret_loss 4.794, FS_loss 11.612, KL_loss: 404748815746555.125, 
	
3770/191900 (epoch 1) loss: 4.791, gen_loss: 10.170, Ret_loss 4.791, FS_loss 11.617, KL_loss: 403657300284609.375, 
	
3775/191900 (epoch 1) loss: 4.789, gen_loss: 10.172, Ret_loss 4.789, FS_loss 11.621, KL_loss: 402578099496580.500, 
	
3780/191900 (epoch 1) loss: 4.787, gen_loss: 10.173, Ret_loss 4.787, FS_loss 11.625, KL_loss: 401497357546850.000, 
	
3785/191900 (epoch 1) loss: 4.784, gen_loss: 10.175, Ret_loss 4.784, FS_loss 11.629, KL_loss: 400422410883461.250, 
	
3790/191900 (epoch 1) loss: 4.782, gen_loss: 10.177, Ret_loss 4.782, FS_loss 11.634, KL_loss: 399357204973516.438, 
	
3795/191900 (epoch 1) loss: 4.780, gen_loss: 10.178, Ret_loss 4.780, FS_loss 11.638, KL_loss: 398338880919724.250, 
	
3800/191900 (epoch 1) loss: 4.777, gen_loss: 10.180, Ret_loss 4.777, FS_loss 11.643, KL_loss: 397280646795025.000, 
	
3805/191900 (epoch 1) loss: 4.775, gen_loss: 10.182, Ret_loss 4.775, FS_loss 11.647, KL_loss: 396228035085249.438, 
	
3810/191900 (epoch 1) loss: 4.773, gen_loss: 10.184, Ret_loss 4.773, FS_loss 11.651, KL_loss: 395181412387253.188, 
	
3815/191900 (epoch 1) loss: 4.770, gen_loss: 10.185, Ret_loss 4.770, FS_loss 11.656, KL_loss: 394325431790325.750, 
	
3820/191900 (epoch 1) loss: 4.768, gen_loss: 10.187, Ret_loss 4.768, FS_loss 11.659, KL_loss: 393288840858235.938, 
	
3825/191900 (epoch 1) loss: 4.766, gen_loss: 10.189, Ret_loss 4.766, FS_loss 11.664, KL_loss: 392257687658690.500, 
	
3830/191900 (epoch 1) loss: 4.763, gen_loss: 10.190, Ret_loss 4.763, FS_loss 11.668, KL_loss: 391232022396816.750, 
	
3835/191900 (epoch 1) loss: 4.761, gen_loss: 10.192, Ret_loss 4.761, FS_loss 11.672, KL_loss: 390231935171873.125, 
	
3840/191900 (epoch 2) loss: 3.679, gen_loss: 10.575, Ret_loss 3.679, FS_loss 13.032, KL_loss: 232855311701.333, 
	
3845/191900 (epoch 2) loss: 3.753, gen_loss: 10.662, Ret_loss 3.753, FS_loss 13.087, KL_loss: 162137691136.000, 
	
3850/191900 (epoch 2) loss: 3.816, gen_loss: 10.779, Ret_loss 3.816, FS_loss 13.246, KL_loss: 157212472241.231, 
	
3855/191900 (epoch 2) loss: 3.785, gen_loss: 10.886, Ret_loss 3.785, FS_loss 13.399, KL_loss: 334431561955.556, 
	
3860/191900 (epoch 2) loss: 3.827, gen_loss: 10.881, Ret_loss 3.827, FS_loss 13.381, KL_loss: 508208850320.696, 
	
3865/191900 (epoch 2) loss: 3.823, gen_loss: 10.922, Ret_loss 3.823, FS_loss 13.442, KL_loss: 946415187382.857, 
	
3870/191900 (epoch 2) loss: 3.847, gen_loss: 10.974, Ret_loss 3.847, FS_loss 13.493, KL_loss: 992356349269.333, 
	
3875/191900 (epoch 2) loss: 3.832, gen_loss: 10.995, Ret_loss 3.832, FS_loss 13.511, KL_loss: 900310170138.947, 
	
3880/191900 (epoch 2) loss: 3.827, gen_loss: 10.995, Ret_loss 3.827, FS_loss 13.503, KL_loss: 816337863227.535, 
	
3885/191900 (epoch 2) loss: 3.827, gen_loss: 10.986, Ret_loss 3.827, FS_loss 13.487, KL_loss: 765871918592.000, 
	
3890/191900 (epoch 2) loss: 3.821, gen_loss: 10.986, Ret_loss 3.821, FS_loss 13.489, KL_loss: 727359919702.943, 
	
3895/191900 (epoch 2) loss: 3.832, gen_loss: 10.993, Ret_loss 3.832, FS_loss 13.485, KL_loss: 677270049474.207, 
	
3900/191900 (epoch 2) loss: 3.838, gen_loss: 10.991, Ret_loss 3.838, FS_loss 13.482, KL_loss: 649020375560.127, 
	
3905/191900 (epoch 2) loss: 3.841, gen_loss: 10.988, Ret_loss 3.841, FS_loss 13.478, KL_loss: 858234068992.000, 
	
3910/191900 (epoch 2) loss: 3.834, gen_loss: 10.984, Ret_loss 3.834, FS_loss 13.477, KL_loss: 804942612956.932, 
	
3915/191900 (epoch 2) loss: 3.838, gen_loss: 10.986, Ret_loss 3.838, FS_loss 13.477, KL_loss: 755740002067.692, 
	
3920/191900 (epoch 2) loss: 3.841, gen_loss: 10.994, Ret_loss 3.841, FS_loss 13.486, KL_loss: 714083654816.385, 
	
3925/191900 (epoch 2) loss: 3.829, gen_loss: 10.994, Ret_loss 3.829, FS_loss 13.493, KL_loss: 1223485510213.818, 
	
3930/191900 (epoch 2) loss: 3.827, gen_loss: 10.994, Ret_loss 3.827, FS_loss 13.493, KL_loss: 1164250049613.075, 
	
3935/191900 (epoch 2) loss: 3.817, gen_loss: 11.000, Ret_loss 3.817, FS_loss 13.503, KL_loss: 1106490329171.592, 
	
3940/191900 (epoch 2) loss: 3.820, gen_loss: 11.009, Ret_loss 3.820, FS_loss 13.513, KL_loss: 1058085668565.748, 
	
3945/191900 (epoch 2) loss: 3.819, gen_loss: 11.016, Ret_loss 3.819, FS_loss 13.520, KL_loss: 8860711883235.555, 
	
3950/191900 (epoch 2) loss: 3.817, gen_loss: 11.020, Ret_loss 3.817, FS_loss 13.524, KL_loss: 8468662205728.566, 
	
3955/191900 (epoch 2) loss: 3.814, gen_loss: 11.018, Ret_loss 3.814, FS_loss 13.525, KL_loss: 8109833564570.170, 
	
3960/191900 (epoch 2) loss: 3.818, gen_loss: 11.025, Ret_loss 3.818, FS_loss 13.534, KL_loss: 7780339389658.667, 
	
3965/191900 (epoch 2) loss: 3.815, gen_loss: 11.027, Ret_loss 3.815, FS_loss 13.536, KL_loss: 7480513738278.125, 
	
3970/191900 (epoch 2) loss: 3.814, gen_loss: 11.030, Ret_loss 3.814, FS_loss 13.539, KL_loss: 7199357040624.722, 
	
3975/191900 (epoch 2) loss: 3.813, gen_loss: 11.035, Ret_loss 3.813, FS_loss 13.541, KL_loss: 6938622767730.203, 
	
3980/191900 (epoch 2) loss: 3.814, gen_loss: 11.039, Ret_loss 3.814, FS_loss 13.544, KL_loss: 6776238323023.776, 
	
3985/191900 (epoch 2) loss: 3.805, gen_loss: 11.042, Ret_loss 3.805, FS_loss 13.547, KL_loss: 6549886730004.000, 
	
3990/191900 (epoch 2) loss: 3.807, gen_loss: 11.038, Ret_loss 3.807, FS_loss 13.540, KL_loss: 6336261008423.425, 
	
3995/191900 (epoch 2) loss: 3.805, gen_loss: 11.040, Ret_loss 3.805, FS_loss 13.543, KL_loss: 6136870472048.709, 
	
4000/191900 (epoch 2) loss: 3.808, gen_loss: 11.040, Ret_loss 3.808, FS_loss 13.544, KL_loss: 6378315784172.466, 
	
4005/191900 (epoch 2) loss: 3.807, gen_loss: 11.042, Ret_loss 3.807, FS_loss 13.543, KL_loss: 6189866242504.477, 
	
4010/191900 (epoch 2) loss: 3.804, gen_loss: 11.044, Ret_loss 3.804, FS_loss 13.546, KL_loss: 6011693182661.642, 
	
4015/191900 (epoch 2) loss: 3.805, gen_loss: 11.040, Ret_loss 3.805, FS_loss 13.540, KL_loss: 5845259632886.741, 
	
4020/191900 (epoch 2) loss: 3.802, gen_loss: 11.041, Ret_loss 3.802, FS_loss 13.541, KL_loss: 6075730128128.787, 
	
4025/191900 (epoch 2) loss: 3.801, gen_loss: 11.048, Ret_loss 3.801, FS_loss 13.550, KL_loss: 5914833291437.702, 
	
4030/191900 (epoch 2) loss: 3.799, gen_loss: 11.055, Ret_loss 3.799, FS_loss 13.559, KL_loss: 5762265373605.223, 
	
4035/191900 (epoch 2) loss: 3.800, gen_loss: 11.060, Ret_loss 3.800, FS_loss 13.566, KL_loss: 5624607382196.444, 
	
4040/191900 (epoch 2) loss: 3.801, gen_loss: 11.068, Ret_loss 3.801, FS_loss 13.576, KL_loss: 5767284069632.709, 
	
4045/191900 (epoch 2) loss: 3.799, gen_loss: 11.064, Ret_loss 3.799, FS_loss 13.573, KL_loss: 8037071757341.000, 
	
4050/191900 (epoch 2) loss: 3.795, gen_loss: 11.069, Ret_loss 3.795, FS_loss 13.582, KL_loss: 7848592019745.127, 
	
4055/191900 (epoch 2) loss: 3.794, gen_loss: 11.067, Ret_loss 3.794, FS_loss 13.581, KL_loss: 7668659312928.367, 
	
4060/191900 (epoch 2) loss: 3.793, gen_loss: 11.066, Ret_loss 3.793, FS_loss 13.580, KL_loss: 7497028308295.820, 
	
4065/191900 (epoch 2) loss: 3.794, gen_loss: 11.064, Ret_loss 3.794, FS_loss 13.577, KL_loss: 7594204130287.789, 
	
4070/191900 (epoch 2) loss: 3.795, gen_loss: 11.068, Ret_loss 3.795, FS_loss 13.582, KL_loss: 7431393296130.815, 
	
4075/191900 (epoch 2) loss: 3.792, gen_loss: 11.072, Ret_loss 3.792, FS_loss 13.587, KL_loss: 7275455225109.042, 
	
4080/191900 (epoch 2) loss: 3.789, gen_loss: 11.074, Ret_loss 3.789, FS_loss 13.589, KL_loss: 7139005981229.893, 
	
4085/191900 (epoch 2) loss: 3.788, gen_loss: 11.077, Ret_loss 3.788, FS_loss 13.595, KL_loss: 7004484426984.839, 
	
4090/191900 (epoch 2) loss: 3.790, gen_loss: 11.081, Ret_loss 3.790, FS_loss 13.601, KL_loss: 6866962929576.537, 
	
4095/191900 (epoch 2) loss: 3.792, gen_loss: 11.088, Ret_loss 3.792, FS_loss 13.609, KL_loss: 6738666824983.380, 
	
4100/191900 (epoch 2) loss: 3.788, gen_loss: 11.088, Ret_loss 3.788, FS_loss 13.612, KL_loss: 6741323081238.936, 
	
4105/191900 (epoch 2) loss: 3.789, gen_loss: 11.092, Ret_loss 3.789, FS_loss 13.617, KL_loss: 6627052918357.552, 
	
4110/191900 (epoch 2) loss: 3.789, gen_loss: 11.090, Ret_loss 3.789, FS_loss 13.615, KL_loss: 6509477555370.257, 
	
4115/191900 (epoch 2) loss: 3.788, gen_loss: 11.091, Ret_loss 3.788, FS_loss 13.616, KL_loss: 6396497171906.820, 
	
4120/191900 (epoch 2) loss: 3.786, gen_loss: 11.093, Ret_loss 3.786, FS_loss 13.622, KL_loss: 6289866140727.689, 
	
4125/191900 (epoch 2) loss: 3.786, gen_loss: 11.093, Ret_loss 3.786, FS_loss 13.623, KL_loss: 6478533678963.167, 
	
4130/191900 (epoch 2) loss: 3.783, gen_loss: 11.097, Ret_loss 3.783, FS_loss 13.629, KL_loss: 7631586154866.075, 
	
4135/191900 (epoch 2) loss: 3.784, gen_loss: 11.095, Ret_loss 3.784, FS_loss 13.627, KL_loss: 7503605977329.879, 
	
4140/191900 (epoch 2) loss: 3.786, gen_loss: 11.094, Ret_loss 3.786, FS_loss 13.628, KL_loss: 7380079814461.307, 
	
4145/191900 (epoch 2) loss: 3.786, gen_loss: 11.097, Ret_loss 3.786, FS_loss 13.633, KL_loss: 7269054432869.039, 
	
4150/191900 (epoch 2) loss: 3.784, gen_loss: 11.101, Ret_loss 3.784, FS_loss 13.638, KL_loss: 7153361058113.892, 
	
4155/191900 (epoch 2) loss: 3.784, gen_loss: 11.105, Ret_loss 3.784, FS_loss 13.643, KL_loss: 7041365120039.899, 
	
4160/191900 (epoch 2) loss: 3.781, gen_loss: 11.110, Ret_loss 3.781, FS_loss 13.652, KL_loss: 6939275758976.842, 
	
4165/191900 (epoch 2) loss: 3.782, gen_loss: 11.112, Ret_loss 3.782, FS_loss 13.657, KL_loss: 6923639177198.488, 
	
4170/191900 (epoch 2) loss: 3.780, gen_loss: 11.115, Ret_loss 3.780, FS_loss 13.660, KL_loss: 6820411761754.378, 
	
4175/191900 (epoch 2) loss: 3.779, gen_loss: 11.116, Ret_loss 3.779, FS_loss 13.664, KL_loss: 6720782627756.355, 
	
4180/191900 (epoch 2) loss: 3.781, gen_loss: 11.121, Ret_loss 3.781, FS_loss 13.670, KL_loss: 6707299038265.890, 
	
4185/191900 (epoch 2) loss: 3.780, gen_loss: 11.121, Ret_loss 3.780, FS_loss 13.672, KL_loss: 6740259106387.540, 
	
4190/191900 (epoch 2) loss: 3.780, gen_loss: 11.125, Ret_loss 3.780, FS_loss 13.678, KL_loss: 6645416948682.017, 
	
4195/191900 (epoch 2) loss: 3.782, gen_loss: 11.127, Ret_loss 3.782, FS_loss 13.681, KL_loss: 6553722820660.604, 
	
4200/191900 (epoch 2) loss: 3.780, gen_loss: 11.130, Ret_loss 3.780, FS_loss 13.685, KL_loss: 6475990011662.501, 
	
4205/191900 (epoch 2) loss: 3.780, gen_loss: 11.131, Ret_loss 3.780, FS_loss 13.687, KL_loss: 6418570120298.826, 
	
4210/191900 (epoch 2) loss: 3.779, gen_loss: 11.133, Ret_loss 3.779, FS_loss 13.690, KL_loss: 6339476112783.143, 
	
4215/191900 (epoch 2) loss: 3.780, gen_loss: 11.135, Ret_loss 3.780, FS_loss 13.695, KL_loss: 6257142465959.661, 
	
4220/191900 (epoch 2) loss: 3.781, gen_loss: 11.140, Ret_loss 3.781, FS_loss 13.701, KL_loss: 6178111099656.396, 
	
4225/191900 (epoch 2) loss: 3.779, gen_loss: 11.143, Ret_loss 3.779, FS_loss 13.707, KL_loss: 6378580309272.783, 
	
4230/191900 (epoch 2) loss: 3.780, gen_loss: 11.146, Ret_loss 3.780, FS_loss 13.713, KL_loss: 7004550636745.648, 
	
4235/191900 (epoch 2) loss: 3.781, gen_loss: 11.149, Ret_loss 3.781, FS_loss 13.718, KL_loss: 6916917332550.473, 
	
4240/191900 (epoch 2) loss: 3.779, gen_loss: 11.151, Ret_loss 3.779, FS_loss 13.721, KL_loss: 6832399050000.873, 
	
4245/191900 (epoch 2) loss: 3.777, gen_loss: 11.152, Ret_loss 3.777, FS_loss 13.725, KL_loss: 6782400321190.628, 
	
4250/191900 (epoch 2) loss: 3.776, gen_loss: 11.155, Ret_loss 3.776, FS_loss 13.729, KL_loss: 6701832098730.188, 
	
4255/191900 (epoch 2) loss: 3.776, gen_loss: 11.156, Ret_loss 3.776, FS_loss 13.729, KL_loss: 6624171442955.980, 
	
4260/191900 (epoch 2) loss: 3.776, gen_loss: 11.159, Ret_loss 3.776, FS_loss 13.735, KL_loss: 6568325467817.191, 
	
4265/191900 (epoch 2) loss: 3.774, gen_loss: 11.160, Ret_loss 3.774, FS_loss 13.738, KL_loss: 6565870451889.981, 
	
4270/191900 (epoch 2) loss: 3.773, gen_loss: 11.161, Ret_loss 3.773, FS_loss 13.740, KL_loss: 6493790980144.222, 
	
4275/191900 (epoch 2) loss: 3.771, gen_loss: 11.162, Ret_loss 3.771, FS_loss 13.743, KL_loss: 6420293408511.744, 
	
4280/191900 (epoch 2) loss: 3.770, gen_loss: 11.164, Ret_loss 3.770, FS_loss 13.745, KL_loss: 6349051928368.867, 
	
4285/191900 (epoch 2) loss: 3.770, gen_loss: 11.166, Ret_loss 3.770, FS_loss 13.748, KL_loss: 6293493351200.893, 
	
4290/191900 (epoch 2) loss: 3.769, gen_loss: 11.170, Ret_loss 3.769, FS_loss 13.754, KL_loss: 6262598646466.154, 
	
4295/191900 (epoch 2) loss: 3.768, gen_loss: 11.172, Ret_loss 3.768, FS_loss 13.758, KL_loss: 6213157248841.537, 
	
4300/191900 (epoch 2) loss: 3.767, gen_loss: 11.175, Ret_loss 3.767, FS_loss 13.761, KL_loss: 6150070221959.775, 
	
4305/191900 (epoch 2) loss: 3.768, gen_loss: 11.177, Ret_loss 3.768, FS_loss 13.764, KL_loss: 6093658678364.752, 
	
4310/191900 (epoch 2) loss: 3.768, gen_loss: 11.178, Ret_loss 3.768, FS_loss 13.765, KL_loss: 6171018966140.245, 
	
4315/191900 (epoch 2) loss: 3.766, gen_loss: 11.182, Ret_loss 3.766, FS_loss 13.770, KL_loss: 6115526799819.280, 
	
4320/191900 (epoch 2) loss: 3.765, gen_loss: 11.186, Ret_loss 3.765, FS_loss 13.775, KL_loss: 6076266054273.093, 
	
4325/191900 (epoch 2) loss: 3.764, gen_loss: 11.190, Ret_loss 3.764, FS_loss 13.780, KL_loss: 6014675126360.951, 
	
4330/191900 (epoch 2) loss: 3.763, gen_loss: 11.196, Ret_loss 3.763, FS_loss 13.786, KL_loss: 5955588688437.777, 
	
4335/191900 (epoch 2) loss: 3.764, gen_loss: 11.200, Ret_loss 3.764, FS_loss 13.792, KL_loss: 7842543357505.574, 
	
4340/191900 (epoch 2) loss: 3.762, gen_loss: 11.204, Ret_loss 3.762, FS_loss 13.795, KL_loss: 7764617334226.481, 
	
4345/191900 (epoch 2) loss: 3.761, gen_loss: 11.208, Ret_loss 3.761, FS_loss 13.799, KL_loss: 7688247647406.142, 
	
4350/191900 (epoch 2) loss: 3.760, gen_loss: 11.214, Ret_loss 3.760, FS_loss 13.806, KL_loss: 7632036815088.312, 
	
4355/191900 (epoch 2) loss: 3.759, gen_loss: 11.218, Ret_loss 3.759, FS_loss 13.811, KL_loss: 7558738145763.120, 
	
4360/191900 (epoch 2) loss: 3.759, gen_loss: 11.222, Ret_loss 3.759, FS_loss 13.815, KL_loss: 7486684670301.277, 
	
4365/191900 (epoch 2) loss: 3.759, gen_loss: 11.229, Ret_loss 3.759, FS_loss 13.822, KL_loss: 7421688053264.272, 
	
4370/191900 (epoch 2) loss: 3.758, gen_loss: 11.232, Ret_loss 3.758, FS_loss 13.825, KL_loss: 7376272283514.267, 
	
4375/191900 (epoch 2) loss: 3.758, gen_loss: 11.236, Ret_loss 3.758, FS_loss 13.830, KL_loss: 7308786463025.279, 
	
4380/191900 (epoch 2) loss: 3.757, gen_loss: 11.239, Ret_loss 3.757, FS_loss 13.833, KL_loss: 7243701963043.153, 
	
4385/191900 (epoch 2) loss: 3.756, gen_loss: 11.243, Ret_loss 3.756, FS_loss 13.837, KL_loss: 7196179315615.562, 
	
4390/191900 (epoch 2) loss: 3.755, gen_loss: 11.247, Ret_loss 3.755, FS_loss 13.842, KL_loss: 7269593977106.777, 
	
4395/191900 (epoch 2) loss: 3.755, gen_loss: 11.250, Ret_loss 3.755, FS_loss 13.845, KL_loss: 7204721253123.470, 
	
4400/191900 (epoch 2) loss: 3.754, gen_loss: 11.252, Ret_loss 3.754, FS_loss 13.848, KL_loss: 7141402351191.104, 
	
4405/191900 (epoch 2) loss: 3.752, gen_loss: 11.254, Ret_loss 3.752, FS_loss 13.850, KL_loss: 7222546048318.000, 
	
4410/191900 (epoch 2) loss: 3.751, gen_loss: 11.258, Ret_loss 3.751, FS_loss 13.854, KL_loss: 7161872762019.323, 
	
4415/191900 (epoch 2) loss: 3.751, gen_loss: 11.261, Ret_loss 3.751, FS_loss 13.858, KL_loss: 7101373378589.038, 
	
4420/191900 (epoch 2) loss: 3.749, gen_loss: 11.264, Ret_loss 3.749, FS_loss 13.860, KL_loss: 7046334384792.617, 
	
4425/191900 (epoch 2) loss: 3.749, gen_loss: 11.268, Ret_loss 3.749, FS_loss 13.864, KL_loss: 7012040008196.163, 
	
4430/191900 (epoch 2) loss: 3.750, gen_loss: 11.271, Ret_loss 3.750, FS_loss 13.867, KL_loss: 6960590993785.120, 
	
4435/191900 (epoch 2) loss: 3.748, gen_loss: 11.276, Ret_loss 3.748, FS_loss 13.874, KL_loss: 6916600092131.559, 
	
4440/191900 (epoch 2) loss: 3.748, gen_loss: 11.280, Ret_loss 3.748, FS_loss 13.878, KL_loss: 6861124066839.589, 
	
4445/191900 (epoch 2) loss: 3.748, gen_loss: 11.283, Ret_loss 3.748, FS_loss 13.881, KL_loss: 6998350347870.974, 
	
4450/191900 (epoch 2) loss: 3.747, gen_loss: 11.288, Ret_loss 3.747, FS_loss 13.887, KL_loss: 6942999673370.545, 
	
4455/191900 (epoch 2) loss: 3.747, gen_loss: 11.291, Ret_loss 3.747, FS_loss 13.890, KL_loss: 6887240205547.936, 
	
4460/191900 (epoch 2) loss: 3.746, gen_loss: 11.296, Ret_loss 3.746, FS_loss 13.894, KL_loss: 6849687887083.686, 
	
4465/191900 (epoch 2) loss: 3.744, gen_loss: 11.297, Ret_loss 3.744, FS_loss 13.894, KL_loss: 6830337946135.465, 
	
4470/191900 (epoch 2) loss: 3.744, gen_loss: 11.299, Ret_loss 3.744, FS_loss 13.897, KL_loss: 6778174194945.845, 
	
4475/191900 (epoch 2) loss: 3.743, gen_loss: 11.305, Ret_loss 3.743, FS_loss 13.903, KL_loss: 6734006934409.855, 
	
4480/191900 (epoch 2) loss: 3.744, gen_loss: 11.307, Ret_loss 3.744, FS_loss 13.905, KL_loss: 6686312845994.228, 
	
4485/191900 (epoch 2) loss: 3.744, gen_loss: 11.310, Ret_loss 3.744, FS_loss 13.908, KL_loss: 6677519685215.432, 
	
4490/191900 (epoch 2) loss: 3.742, gen_loss: 11.314, Ret_loss 3.742, FS_loss 13.912, KL_loss: 15008052977313.348, 
	
4495/191900 (epoch 2) loss: 3.742, gen_loss: 11.317, Ret_loss 3.742, FS_loss 13.915, KL_loss: 14901324353088.414, 
	
4500/191900 (epoch 2) loss: 3.742, gen_loss: 11.320, Ret_loss 3.742, FS_loss 13.919, KL_loss: 14794282549681.062, 
	
4505/191900 (epoch 2) loss: 3.740, gen_loss: 11.322, Ret_loss 3.740, FS_loss 13.921, KL_loss: 14684817814890.371, 
	
4510/191900 (epoch 2) loss: 3.739, gen_loss: 11.324, Ret_loss 3.739, FS_loss 13.923, KL_loss: 14576883745365.041, 
	
4515/191900 (epoch 2) loss: 3.739, gen_loss: 11.326, Ret_loss 3.739, FS_loss 13.926, KL_loss: 14496724003245.521, 
	
4520/191900 (epoch 2) loss: 3.737, gen_loss: 11.329, Ret_loss 3.737, FS_loss 13.928, KL_loss: 14419951634939.338, 
	
4525/191900 (epoch 2) loss: 3.735, gen_loss: 11.329, Ret_loss 3.735, FS_loss 13.929, KL_loss: 14317017506328.395, 
	
4530/191900 (epoch 2) loss: 3.734, gen_loss: 11.333, Ret_loss 3.734, FS_loss 13.934, KL_loss: 14222573493492.387, 
	
4535/191900 (epoch 2) loss: 3.733, gen_loss: 11.338, Ret_loss 3.733, FS_loss 13.939, KL_loss: 14488734573418.934, 
	
4540/191900 (epoch 2) loss: 3.733, gen_loss: 11.341, Ret_loss 3.733, FS_loss 13.943, KL_loss: 14385823026194.049, 
	
4545/191900 (epoch 2) loss: 3.732, gen_loss: 11.344, Ret_loss 3.732, FS_loss 13.947, KL_loss: 14284404156376.068, 
	
4550/191900 (epoch 2) loss: 3.731, gen_loss: 11.347, Ret_loss 3.731, FS_loss 13.951, KL_loss: 14238676447692.141, 
	
4555/191900 (epoch 2) loss: 3.730, gen_loss: 11.351, Ret_loss 3.730, FS_loss 13.956, KL_loss: 16501654427331.230, 
	
4560/191900 (epoch 2) loss: 3.730, gen_loss: 11.353, Ret_loss 3.730, FS_loss 13.959, KL_loss: 16387559257673.141, 
	
4565/191900 (epoch 2) loss: 3.730, gen_loss: 11.355, Ret_loss 3.730, FS_loss 13.962, KL_loss: 16275085050758.176, 
	
4570/191900 (epoch 2) loss: 3.730, gen_loss: 11.359, Ret_loss 3.730, FS_loss 13.966, KL_loss: 16166959985748.365, 
	
4575/191900 (epoch 2) loss: 3.729, gen_loss: 11.360, Ret_loss 3.729, FS_loss 13.968, KL_loss: 16057550877327.457, 
	
4580/191900 (epoch 2) loss: 3.728, gen_loss: 11.358, Ret_loss 3.728, FS_loss 13.966, KL_loss: 15950088837677.330, 
	
4585/191900 (epoch 2) loss: 3.726, gen_loss: 11.361, Ret_loss 3.726, FS_loss 13.970, KL_loss: 15875415112718.225, 
	
4590/191900 (epoch 2) loss: 3.726, gen_loss: 11.364, Ret_loss 3.726, FS_loss 13.974, KL_loss: 15770856404154.836, 
	
4595/191900 (epoch 2) loss: 3.725, gen_loss: 11.365, Ret_loss 3.725, FS_loss 13.976, KL_loss: 15669075843799.324, 
	
4600/191900 (epoch 2) loss: 3.724, gen_loss: 11.368, Ret_loss 3.724, FS_loss 13.979, KL_loss: 15635009425754.779, 
	
4605/191900 (epoch 2) loss: 3.722, gen_loss: 11.370, Ret_loss 3.722, FS_loss 13.982, KL_loss: 15534110712381.854, 
	
4610/191900 (epoch 2) loss: 3.721, gen_loss: 11.371, Ret_loss 3.721, FS_loss 13.984, KL_loss: 15434721953850.805, 
	
4615/191900 (epoch 2) loss: 3.720, gen_loss: 11.373, Ret_loss 3.720, FS_loss 13.987, KL_loss: 15339099543881.562, 
	
4620/191900 (epoch 2) loss: 3.718, gen_loss: 11.376, Ret_loss 3.718, FS_loss 13.990, KL_loss: 15247516531970.146, 
	
4625/191900 (epoch 2) loss: 3.718, gen_loss: 11.379, Ret_loss 3.718, FS_loss 13.994, KL_loss: 15691183593511.492, 
	
4630/191900 (epoch 2) loss: 3.717, gen_loss: 11.382, Ret_loss 3.717, FS_loss 14.000, KL_loss: 15592334162519.021, 
	
4635/191900 (epoch 2) loss: 3.716, gen_loss: 11.384, Ret_loss 3.716, FS_loss 14.002, KL_loss: 15494663799760.061, 
	
4640/191900 (epoch 2) loss: 3.715, gen_loss: 11.387, Ret_loss 3.715, FS_loss 14.005, KL_loss: 15545458495608.688, 
	
4645/191900 (epoch 2) loss: 3.715, gen_loss: 11.390, Ret_loss 3.715, FS_loss 14.010, KL_loss: 21972443121292.219, 
	
4650/191900 (epoch 2) loss: 3.714, gen_loss: 11.393, Ret_loss 3.714, FS_loss 14.014, KL_loss: 21839235650632.602, 
	
4655/191900 (epoch 2) loss: 3.714, gen_loss: 11.395, Ret_loss 3.714, FS_loss 14.016, KL_loss: 21709424547778.211, 
	
4660/191900 (epoch 2) loss: 3.713, gen_loss: 11.396, Ret_loss 3.713, FS_loss 14.017, KL_loss: 21838234604215.078, 
	
4665/191900 (epoch 2) loss: 3.712, gen_loss: 11.397, Ret_loss 3.712, FS_loss 14.019, KL_loss: 21706560452063.402, 
	
4670/191900 (epoch 2) loss: 3.712, gen_loss: 11.399, Ret_loss 3.712, FS_loss 14.021, KL_loss: 21576405726101.840, 
	
4675/191900 (epoch 2) loss: 3.711, gen_loss: 11.402, Ret_loss 3.711, FS_loss 14.026, KL_loss: 21459213983590.816, 
	
4680/191900 (epoch 2) loss: 3.711, gen_loss: 11.404, Ret_loss 3.711, FS_loss 14.030, KL_loss: 21345660117218.715, 
	
4685/191900 (epoch 2) loss: 3.709, gen_loss: 11.408, Ret_loss 3.709, FS_loss 14.035, KL_loss: 21222042447662.660, 
	
4690/191900 (epoch 2) loss: 3.708, gen_loss: 11.409, Ret_loss 3.708, FS_loss 14.036, KL_loss: 21100731301103.664, 
	
4695/191900 (epoch 2) loss: 3.708, gen_loss: 11.411, Ret_loss 3.708, FS_loss 14.039, KL_loss: 20990403175319.738, 
	
4700/191900 (epoch 2) loss: 3.706, gen_loss: 11.413, Ret_loss 3.706, FS_loss 14.043, KL_loss: 20881713055711.535, 
	
4705/191900 (epoch 2) loss: 3.707, gen_loss: 11.416, Ret_loss 3.707, FS_loss 14.047, KL_loss: 20766001671591.098, 
	
4710/191900 (epoch 2) loss: 3.706, gen_loss: 11.418, Ret_loss 3.706, FS_loss 14.050, KL_loss: 21060200039059.957, 
	
4715/191900 (epoch 2) loss: 3.705, gen_loss: 11.419, Ret_loss 3.705, FS_loss 14.052, KL_loss: 20940523506506.805, 
	
4720/191900 (epoch 2) loss: 3.704, gen_loss: 11.421, Ret_loss 3.704, FS_loss 14.055, KL_loss: 20822010386524.359, 
	
4725/191900 (epoch 2) loss: 3.703, gen_loss: 11.422, Ret_loss 3.703, FS_loss 14.057, KL_loss: 20711387098512.883, 
	
4730/191900 (epoch 2) loss: 3.702, gen_loss: 11.426, Ret_loss 3.702, FS_loss 14.063, KL_loss: 20596693930405.570, 
	
4735/191900 (epoch 2) loss: 3.701, gen_loss: 11.429, Ret_loss 3.701, FS_loss 14.067, KL_loss: 20482206308333.344, 
	
4740/191900 (epoch 2) loss: 3.700, gen_loss: 11.432, Ret_loss 3.700, FS_loss 14.071, KL_loss: 20369989924929.363, 
	
4745/191900 (epoch 2) loss: 3.699, gen_loss: 11.434, Ret_loss 3.699, FS_loss 14.074, KL_loss: 20617904134148.105, 
	
4750/191900 (epoch 2) loss: 3.699, gen_loss: 11.436, Ret_loss 3.699, FS_loss 14.078, KL_loss: 20506235600083.574, 
	
4755/191900 (epoch 2) loss: 3.698, gen_loss: 11.439, Ret_loss 3.698, FS_loss 14.082, KL_loss: 20396008226579.121, 
	
4760/191900 (epoch 2) loss: 3.698, gen_loss: 11.440, Ret_loss 3.698, FS_loss 14.085, KL_loss: 20332715011554.203, 
	
4765/191900 (epoch 2) loss: 3.696, gen_loss: 11.442, Ret_loss 3.696, FS_loss 14.088, KL_loss: 20223525821015.879, 
	
4770/191900 (epoch 2) loss: 3.696, gen_loss: 11.445, Ret_loss 3.696, FS_loss 14.092, KL_loss: 20115491492111.793, 
	
4775/191900 (epoch 2) loss: 3.695, gen_loss: 11.449, Ret_loss 3.695, FS_loss 14.098, KL_loss: 20298967936469.031, 
	
4780/191900 (epoch 2) loss: 3.693, gen_loss: 11.451, Ret_loss 3.693, FS_loss 14.101, KL_loss: 20193789827160.652, 
	
4785/191900 (epoch 2) loss: 3.694, gen_loss: 11.453, Ret_loss 3.694, FS_loss 14.105, KL_loss: 20088539793204.539, 
	
4790/191900 (epoch 2) loss: 3.693, gen_loss: 11.456, Ret_loss 3.693, FS_loss 14.109, KL_loss: 19984913846572.473, 
	
4795/191900 (epoch 2) loss: 3.693, gen_loss: 11.459, Ret_loss 3.693, FS_loss 14.113, KL_loss: 20102932864472.066, 
	
4800/191900 (epoch 2) loss: 3.693, gen_loss: 11.461, Ret_loss 3.693, FS_loss 14.116, KL_loss: 20001309207189.020, 
	
4805/191900 (epoch 2) loss: 3.692, gen_loss: 11.462, Ret_loss 3.692, FS_loss 14.119, KL_loss: 19899176719786.992, 
	
4810/191900 (epoch 2) loss: 3.691, gen_loss: 11.465, Ret_loss 3.691, FS_loss 14.124, KL_loss: 19798657070554.262, 
	
4815/191900 (epoch 2) loss: 3.691, gen_loss: 11.465, Ret_loss 3.691, FS_loss 14.126, KL_loss: 19700238960363.207, 
	
4820/191900 (epoch 2) loss: 3.690, gen_loss: 11.468, Ret_loss 3.690, FS_loss 14.131, KL_loss: 19604198034722.262, 
	
4825/191900 (epoch 2) loss: 3.688, gen_loss: 11.470, Ret_loss 3.688, FS_loss 14.136, KL_loss: 19506741987364.938, 
	
4830/191900 (epoch 2) loss: 3.688, gen_loss: 11.472, Ret_loss 3.688, FS_loss 14.140, KL_loss: 19410148166615.410, 
	
4835/191900 (epoch 2) loss: 3.687, gen_loss: 11.474, Ret_loss 3.687, FS_loss 14.145, KL_loss: 19552126971956.984, 
	
4840/191900 (epoch 2) loss: 3.687, gen_loss: 11.475, Ret_loss 3.687, FS_loss 14.148, KL_loss: 19455397675224.070, 
	
4845/191900 (epoch 2) loss: 3.687, gen_loss: 11.478, Ret_loss 3.687, FS_loss 14.152, KL_loss: 19359578350181.223, 
	
4850/191900 (epoch 2) loss: 3.686, gen_loss: 11.480, Ret_loss 3.686, FS_loss 14.157, KL_loss: 19380786304876.051, 
	
4855/191900 (epoch 2) loss: 3.685, gen_loss: 11.484, Ret_loss 3.685, FS_loss 14.164, KL_loss: 19285686891288.281, 
	
4860/191900 (epoch 2) loss: 3.684, gen_loss: 11.486, Ret_loss 3.684, FS_loss 14.168, KL_loss: 19191490332048.031, 
	
4865/191900 (epoch 2) loss: 3.683, gen_loss: 11.488, Ret_loss 3.683, FS_loss 14.173, KL_loss: 20500397698741.434, 
	
4870/191900 (epoch 2) loss: 3.684, gen_loss: 11.491, Ret_loss 3.684, FS_loss 14.179, KL_loss: 20401172932247.340, 
	
4875/191900 (epoch 2) loss: 3.684, gen_loss: 11.493, Ret_loss 3.684, FS_loss 14.184, KL_loss: 20302903282810.742, 
	
4880/191900 (epoch 2) loss: 3.683, gen_loss: 11.495, Ret_loss 3.683, FS_loss 14.189, KL_loss: 20205886816193.152, 
	
4885/191900 (epoch 2) loss: 3.682, gen_loss: 11.497, Ret_loss 3.682, FS_loss 14.194, KL_loss: 20109536633835.711, 
	
4890/191900 (epoch 2) loss: 3.681, gen_loss: 11.498, Ret_loss 3.681, FS_loss 14.198, KL_loss: 20014058317187.875, 
	
4895/191900 (epoch 2) loss: 3.681, gen_loss: 11.501, Ret_loss 3.681, FS_loss 14.204, KL_loss: 19919638834724.645, 
	
4900/191900 (epoch 2) loss: 3.680, gen_loss: 11.502, Ret_loss 3.680, FS_loss 14.208, KL_loss: 19826870944827.590, 
	
4905/191900 (epoch 2) loss: 3.679, gen_loss: 11.505, Ret_loss 3.679, FS_loss 14.214, KL_loss: 19734088741021.109, 
	
4910/191900 (epoch 2) loss: 3.679, gen_loss: 11.506, Ret_loss 3.679, FS_loss 14.218, KL_loss: 19643423656681.199, 
	
4915/191900 (epoch 2) loss: 3.678, gen_loss: 11.507, Ret_loss 3.678, FS_loss 14.220, KL_loss: 19553467522316.691, 
	
4920/191900 (epoch 2) loss: 3.677, gen_loss: 11.508, Ret_loss 3.677, FS_loss 14.224, KL_loss: 19463317456556.426, 
	
4925/191900 (epoch 2) loss: 3.676, gen_loss: 11.509, Ret_loss 3.676, FS_loss 14.228, KL_loss: 19395359492155.160, 
	
4930/191900 (epoch 2) loss: 3.676, gen_loss: 11.512, Ret_loss 3.676, FS_loss 14.234, KL_loss: 19310227522584.227, 
	
4935/191900 (epoch 2) loss: 3.675, gen_loss: 11.514, Ret_loss 3.675, FS_loss 14.239, KL_loss: 19222902868604.836, 
	
4940/191900 (epoch 2) loss: 3.674, gen_loss: 11.515, Ret_loss 3.674, FS_loss 14.242, KL_loss: 19145270074967.602, 
	
4945/191900 (epoch 2) loss: 3.674, gen_loss: 11.517, Ret_loss 3.674, FS_loss 14.247, KL_loss: 19059944394580.895, 
	
4950/191900 (epoch 2) loss: 3.673, gen_loss: 11.518, Ret_loss 3.673, FS_loss 14.251, KL_loss: 18974917828989.684, 
	
4955/191900 (epoch 2) loss: 3.671, gen_loss: 11.520, Ret_loss 3.671, FS_loss 14.257, KL_loss: 19016827637539.133, 
	
4960/191900 (epoch 2) loss: 3.671, gen_loss: 11.522, Ret_loss 3.671, FS_loss 14.261, KL_loss: 18934071255330.750, 
	
4965/191900 (epoch 2) loss: 3.670, gen_loss: 11.523, Ret_loss 3.670, FS_loss 14.266, KL_loss: 18850844706037.887, 
	
4970/191900 (epoch 2) loss: 3.669, gen_loss: 11.525, Ret_loss 3.669, FS_loss 14.271, KL_loss: 18778493476313.461, 
	
4975/191900 (epoch 2) loss: 3.668, gen_loss: 11.527, Ret_loss 3.668, FS_loss 14.275, KL_loss: 18913585809705.715, 
	
4980/191900 (epoch 2) loss: 3.667, gen_loss: 11.528, Ret_loss 3.667, FS_loss 14.278, KL_loss: 18831126632430.852, 
	
4985/191900 (epoch 2) loss: 3.667, gen_loss: 11.530, Ret_loss 3.667, FS_loss 14.283, KL_loss: 18750347988855.402, 
	
4990/191900 (epoch 2) loss: 3.667, gen_loss: 11.531, Ret_loss 3.667, FS_loss 14.287, KL_loss: 19494441019929.188, 
	
4995/191900 (epoch 2) loss: 3.666, gen_loss: 11.532, Ret_loss 3.666, FS_loss 14.291, KL_loss: 19410845545883.066, 
	
5000/191900 (epoch 2) loss: 3.665, gen_loss: 11.534, Ret_loss 3.665, FS_loss 14.294, KL_loss: 19328184699627.406, 
	
5005/191900 (epoch 2) loss: 3.665, gen_loss: 11.536, Ret_loss 3.665, FS_loss 14.299, KL_loss: 19255886972134.453, 
	
5010/191900 (epoch 2) loss: 3.664, gen_loss: 11.537, Ret_loss 3.664, FS_loss 14.303, KL_loss: 19174113308391.652, 
	
5015/191900 (epoch 2) loss: 3.664, gen_loss: 11.538, Ret_loss 3.664, FS_loss 14.307, KL_loss: 19093287332207.578, 
	
5020/191900 (epoch 2) loss: 3.663, gen_loss: 11.539, Ret_loss 3.663, FS_loss 14.311, KL_loss: 19367505618089.535, 
	
5025/191900 (epoch 2) loss: 3.664, gen_loss: 11.541, Ret_loss 3.664, FS_loss 14.314, KL_loss: 19286036425665.387, 
	
5030/191900 (epoch 2) loss: 3.663, gen_loss: 11.542, Ret_loss 3.663, FS_loss 14.318, KL_loss: 19205425844750.473, 
	
5035/191900 (epoch 2) loss: 3.663, gen_loss: 11.543, Ret_loss 3.663, FS_loss 14.322, KL_loss: 19128356296370.098, 
	
5040/191900 (epoch 2) loss: 3.661, gen_loss: 11.545, Ret_loss 3.661, FS_loss 14.326, KL_loss: 19049042146554.559, 
	
5045/191900 (epoch 2) loss: 3.661, gen_loss: 11.546, Ret_loss 3.661, FS_loss 14.330, KL_loss: 18977102345240.887, 
	
5050/191900 (epoch 2) loss: 3.660, gen_loss: 11.549, Ret_loss 3.660, FS_loss 14.335, KL_loss: 18899699405132.070, 
	
5055/191900 (epoch 2) loss: 3.660, gen_loss: 11.550, Ret_loss 3.660, FS_loss 14.338, KL_loss: 18822837421697.773, 
	
5060/191900 (epoch 2) loss: 3.659, gen_loss: 11.551, Ret_loss 3.659, FS_loss 14.343, KL_loss: 18877529319001.473, 
	
5065/191900 (epoch 2) loss: 3.659, gen_loss: 11.553, Ret_loss 3.659, FS_loss 14.347, KL_loss: 18809695424870.031, 
	
5070/191900 (epoch 2) loss: 3.658, gen_loss: 11.554, Ret_loss 3.658, FS_loss 14.351, KL_loss: 18734104831471.273, 
	
5075/191900 (epoch 2) loss: 3.657, gen_loss: 11.555, Ret_loss 3.657, FS_loss 14.354, KL_loss: 18659926916495.805, 
	
5080/191900 (epoch 2) loss: 3.656, gen_loss: 11.556, Ret_loss 3.656, FS_loss 14.357, KL_loss: 18613323762988.164, 
	
5085/191900 (epoch 2) loss: 3.656, gen_loss: 11.557, Ret_loss 3.656, FS_loss 14.360, KL_loss: 18539050003667.168, 
	
5090/191900 (epoch 2) loss: 3.654, gen_loss: 11.558, Ret_loss 3.654, FS_loss 14.364, KL_loss: 18466723748895.348, 
	
5095/191900 (epoch 2) loss: 3.654, gen_loss: 11.560, Ret_loss 3.654, FS_loss 14.368, KL_loss: 22084828608478.207, 
	
5100/191900 (epoch 2) loss: 3.653, gen_loss: 11.562, Ret_loss 3.653, FS_loss 14.373, KL_loss: 21997402185245.531, 
	
5105/191900 (epoch 2) loss: 3.652, gen_loss: 11.564, Ret_loss 3.652, FS_loss 14.378, KL_loss: 21910682343971.672, 
	
5110/191900 (epoch 2) loss: 3.652, gen_loss: 11.566, Ret_loss 3.652, FS_loss 14.382, KL_loss: 21825319009846.836, 
	
5115/191900 (epoch 2) loss: 3.651, gen_loss: 11.568, Ret_loss 3.651, FS_loss 14.386, KL_loss: 21739950988532.117, 
	
5120/191900 (epoch 2) loss: 3.651, gen_loss: 11.569, Ret_loss 3.651, FS_loss 14.390, KL_loss: 21655432930593.059, 
	
5125/191900 (epoch 2) loss: 3.650, gen_loss: 11.570, Ret_loss 3.650, FS_loss 14.394, KL_loss: 21603884033145.777, 
	
5130/191900 (epoch 2) loss: 3.649, gen_loss: 11.572, Ret_loss 3.649, FS_loss 14.397, KL_loss: 21520378689896.871, 
	
5135/191900 (epoch 2) loss: 3.648, gen_loss: 11.573, Ret_loss 3.648, FS_loss 14.401, KL_loss: 21462145161823.199, 
	
5140/191900 (epoch 2) loss: 3.648, gen_loss: 11.573, Ret_loss 3.648, FS_loss 14.403, KL_loss: 21380091491575.293, 
	
5145/191900 (epoch 2) loss: 3.647, gen_loss: 11.574, Ret_loss 3.647, FS_loss 14.407, KL_loss: 21298589014189.543, 
	
5150/191900 (epoch 2) loss: 3.647, gen_loss: 11.576, Ret_loss 3.647, FS_loss 14.411, KL_loss: 21309528036652.004, 
	
5155/191900 (epoch 2) loss: 3.646, gen_loss: 11.577, Ret_loss 3.646, FS_loss 14.414, KL_loss: 21228829442238.871, 
	
5160/191900 (epoch 2) loss: 3.645, gen_loss: 11.579, Ret_loss 3.645, FS_loss 14.418, KL_loss: 21148871885262.598, 
	
5165/191900 (epoch 2) loss: 3.644, gen_loss: 11.580, Ret_loss 3.644, FS_loss 14.421, KL_loss: 21088097319989.723, 
	
5170/191900 (epoch 2) loss: 3.644, gen_loss: 11.581, Ret_loss 3.644, FS_loss 14.424, KL_loss: 21009579323688.270, 
	
5175/191900 (epoch 2) loss: 3.643, gen_loss: 11.582, Ret_loss 3.643, FS_loss 14.427, KL_loss: 20933617038393.914, 
	
5180/191900 (epoch 2) loss: 3.643, gen_loss: 11.583, Ret_loss 3.643, FS_loss 14.432, KL_loss: 20888155191878.277, 
	
5185/191900 (epoch 2) loss: 3.643, gen_loss: 11.585, Ret_loss 3.643, FS_loss 14.436, KL_loss: 20815825436670.230, 
	
5190/191900 (epoch 2) loss: 3.642, gen_loss: 11.587, Ret_loss 3.642, FS_loss 14.440, KL_loss: 21371799127915.410, 
	
5195/191900 (epoch 2) loss: 3.642, gen_loss: 11.588, Ret_loss 3.642, FS_loss 14.444, KL_loss: 21388841112786.887, 
	
5200/191900 (epoch 2) loss: 3.641, gen_loss: 11.589, Ret_loss 3.641, FS_loss 14.448, KL_loss: 21310809257695.262, 
	
5205/191900 (epoch 2) loss: 3.640, gen_loss: 11.591, Ret_loss 3.640, FS_loss 14.452, KL_loss: 21233071485364.902, 
	
5210/191900 (epoch 2) loss: 3.640, gen_loss: 11.592, Ret_loss 3.640, FS_loss 14.456, KL_loss: 21158845840315.887, 
	
5215/191900 (epoch 2) loss: 3.639, gen_loss: 11.593, Ret_loss 3.639, FS_loss 14.460, KL_loss: 21217387957819.949, 
	
5220/191900 (epoch 2) loss: 3.639, gen_loss: 11.594, Ret_loss 3.639, FS_loss 14.463, KL_loss: 21141364274007.684, 
	
5225/191900 (epoch 2) loss: 3.638, gen_loss: 11.596, Ret_loss 3.638, FS_loss 14.466, KL_loss: 21066793858859.285, 
	
5230/191900 (epoch 2) loss: 3.638, gen_loss: 11.597, Ret_loss 3.638, FS_loss 14.470, KL_loss: 21002763747668.848, 
	
5235/191900 (epoch 2) loss: 3.637, gen_loss: 11.598, Ret_loss 3.637, FS_loss 14.474, KL_loss: 20927823144265.375, 
	
5240/191900 (epoch 2) loss: 3.636, gen_loss: 11.600, Ret_loss 3.636, FS_loss 14.479, KL_loss: 20853652087265.473, 
	
5245/191900 (epoch 2) loss: 3.635, gen_loss: 11.601, Ret_loss 3.635, FS_loss 14.482, KL_loss: 20786219278565.578, 
	
5250/191900 (epoch 2) loss: 3.635, gen_loss: 11.602, Ret_loss 3.635, FS_loss 14.485, KL_loss: 20761829542921.184, 
	
5255/191900 (epoch 2) loss: 3.634, gen_loss: 11.604, Ret_loss 3.634, FS_loss 14.490, KL_loss: 20689075255678.500, 
	
5260/191900 (epoch 2) loss: 3.633, gen_loss: 11.606, Ret_loss 3.633, FS_loss 14.495, KL_loss: 20616483869492.117, 
	
5265/191900 (epoch 2) loss: 3.633, gen_loss: 11.607, Ret_loss 3.633, FS_loss 14.498, KL_loss: 20551976689801.445, 
	
5270/191900 (epoch 2) loss: 3.632, gen_loss: 11.609, Ret_loss 3.632, FS_loss 14.502, KL_loss: 20480976921141.715, 
	
5275/191900 (epoch 2) loss: 3.631, gen_loss: 11.610, Ret_loss 3.631, FS_loss 14.506, KL_loss: 20411180768949.352, 
	
5280/191900 (epoch 2) loss: 3.630, gen_loss: 11.612, Ret_loss 3.630, FS_loss 14.510, KL_loss: 20594283220426.898, 
	
5285/191900 (epoch 2) loss: 3.629, gen_loss: 11.613, Ret_loss 3.629, FS_loss 14.514, KL_loss: 20523228352305.270, 
	
5290/191900 (epoch 2) loss: 3.628, gen_loss: 11.615, Ret_loss 3.628, FS_loss 14.518, KL_loss: 20452659505411.820, 
	
5295/191900 (epoch 2) loss: 3.627, gen_loss: 11.615, Ret_loss 3.627, FS_loss 14.521, KL_loss: 20406363524073.996, 
	
5300/191900 (epoch 2) loss: 3.627, gen_loss: 11.616, Ret_loss 3.627, FS_loss 14.525, KL_loss: 20336748336922.895, 
	
5305/191900 (epoch 2) loss: 3.627, gen_loss: 11.617, Ret_loss 3.627, FS_loss 14.527, KL_loss: 20267709648200.316, 
	
5310/191900 (epoch 2) loss: 3.626, gen_loss: 11.618, Ret_loss 3.626, FS_loss 14.531, KL_loss: 20348840166862.762, 
	
5315/191900 (epoch 2) loss: 3.626, gen_loss: 11.620, Ret_loss 3.626, FS_loss 14.535, KL_loss: 20282954405759.598, 
	
5320/191900 (epoch 2) loss: 3.626, gen_loss: 11.621, Ret_loss 3.626, FS_loss 14.538, KL_loss: 20215597277561.473, 
	
5325/191900 (epoch 2) loss: 3.625, gen_loss: 11.622, Ret_loss 3.625, FS_loss 14.541, KL_loss: 20148638099837.711, 
	
5330/191900 (epoch 2) loss: 3.624, gen_loss: 11.623, Ret_loss 3.624, FS_loss 14.543, KL_loss: 20718765949231.613, 
	
5335/191900 (epoch 2) loss: 3.623, gen_loss: 11.624, Ret_loss 3.623, FS_loss 14.546, KL_loss: 20650390703446.250, 
	
5340/191900 (epoch 2) loss: 3.623, gen_loss: 11.624, Ret_loss 3.623, FS_loss 14.548, KL_loss: 20582470912668.137, 
	
5345/191900 (epoch 2) loss: 3.622, gen_loss: 11.625, Ret_loss 3.622, FS_loss 14.551, KL_loss: 20523363436247.035, 
	
5350/191900 (epoch 2) loss: 3.622, gen_loss: 11.626, Ret_loss 3.622, FS_loss 14.554, KL_loss: 20456969527985.438, 
	
5355/191900 (epoch 2) loss: 3.621, gen_loss: 11.627, Ret_loss 3.621, FS_loss 14.558, KL_loss: 20391995149900.680, 
	
5360/191900 (epoch 2) loss: 3.621, gen_loss: 11.628, Ret_loss 3.621, FS_loss 14.561, KL_loss: 20339046989244.879, 
	
5365/191900 (epoch 2) loss: 3.620, gen_loss: 11.630, Ret_loss 3.620, FS_loss 14.565, KL_loss: 20274354184418.965, 
	
5370/191900 (epoch 2) loss: 3.620, gen_loss: 11.632, Ret_loss 3.620, FS_loss 14.570, KL_loss: 20209774394186.094, 
	
5375/191900 (epoch 2) loss: 3.619, gen_loss: 11.633, Ret_loss 3.619, FS_loss 14.573, KL_loss: 24320491297326.387, 
	
5380/191900 (epoch 2) loss: 3.619, gen_loss: 11.634, Ret_loss 3.619, FS_loss 14.576, KL_loss: 24241691411837.875, 
	
5385/191900 (epoch 2) loss: 3.618, gen_loss: 11.635, Ret_loss 3.618, FS_loss 14.579, KL_loss: 24163395396493.180, 
	
5390/191900 (epoch 2) loss: 3.618, gen_loss: 11.636, Ret_loss 3.618, FS_loss 14.582, KL_loss: 24093492016651.156, 
	
5395/191900 (epoch 2) loss: 3.618, gen_loss: 11.637, Ret_loss 3.618, FS_loss 14.585, KL_loss: 24016189458238.223, 
	
5400/191900 (epoch 2) loss: 3.617, gen_loss: 11.638, Ret_loss 3.617, FS_loss 14.587, KL_loss: 23939379333746.438, 
	
5405/191900 (epoch 2) loss: 3.617, gen_loss: 11.639, Ret_loss 3.617, FS_loss 14.591, KL_loss: 23867880723218.398, 
	
5410/191900 (epoch 2) loss: 3.617, gen_loss: 11.641, Ret_loss 3.617, FS_loss 14.595, KL_loss: 23792088938035.863, 
	
5415/191900 (epoch 2) loss: 3.617, gen_loss: 11.642, Ret_loss 3.617, FS_loss 14.598, KL_loss: 23716766228380.176, 
	
5420/191900 (epoch 2) loss: 3.616, gen_loss: 11.644, Ret_loss 3.616, FS_loss 14.602, KL_loss: 23695086757091.164, 
	
5425/191900 (epoch 2) loss: 3.616, gen_loss: 11.645, Ret_loss 3.616, FS_loss 14.605, KL_loss: 23620756578496.273, 
	
5430/191900 (epoch 2) loss: 3.615, gen_loss: 11.647, Ret_loss 3.615, FS_loss 14.609, KL_loss: 23546858369423.941, 
	
5435/191900 (epoch 2) loss: 3.614, gen_loss: 11.649, Ret_loss 3.614, FS_loss 14.613, KL_loss: 23528487511909.035, 
	
5440/191900 (epoch 2) loss: 3.614, gen_loss: 11.650, Ret_loss 3.614, FS_loss 14.616, KL_loss: 23455374756758.707, 
	
5445/191900 (epoch 2) loss: 3.613, gen_loss: 11.651, Ret_loss 3.613, FS_loss 14.619, KL_loss: 23382544986500.566, 
	
5450/191900 (epoch 2) loss: 3.613, gen_loss: 11.652, Ret_loss 3.613, FS_loss 14.622, KL_loss: 23399504912141.598, 
	
5455/191900 (epoch 2) loss: 3.612, gen_loss: 11.654, Ret_loss 3.612, FS_loss 14.627, KL_loss: 23327456005283.391, 
	
5460/191900 (epoch 2) loss: 3.612, gen_loss: 11.655, Ret_loss 3.612, FS_loss 14.631, KL_loss: 23255670804726.172, 
	
5465/191900 (epoch 2) loss: 3.611, gen_loss: 11.657, Ret_loss 3.611, FS_loss 14.634, KL_loss: 23206392134466.152, 
	
5470/191900 (epoch 2) loss: 3.611, gen_loss: 11.658, Ret_loss 3.611, FS_loss 14.639, KL_loss: 23137460492639.266, 
	
5475/191900 (epoch 2) loss: 3.610, gen_loss: 11.660, Ret_loss 3.610, FS_loss 14.642, KL_loss: 23068021153035.672, 
	
5480/191900 (epoch 2) loss: 3.609, gen_loss: 11.661, Ret_loss 3.609, FS_loss 14.646, KL_loss: 23738310990155.676, 
	
5485/191900 (epoch 2) loss: 3.609, gen_loss: 11.662, Ret_loss 3.609, FS_loss 14.650, KL_loss: 23666431296901.699, 
	
5490/191900 (epoch 2) loss: 3.609, gen_loss: 11.664, Ret_loss 3.609, FS_loss 14.654, KL_loss: 23594896792878.414, 
	
5495/191900 (epoch 2) loss: 3.608, gen_loss: 11.665, Ret_loss 3.608, FS_loss 14.657, KL_loss: 23528208075341.926, 
	
5500/191900 (epoch 2) loss: 3.608, gen_loss: 11.666, Ret_loss 3.608, FS_loss 14.660, KL_loss: 23457553004910.480, 
	
5505/191900 (epoch 2) loss: 3.608, gen_loss: 11.667, Ret_loss 3.608, FS_loss 14.662, KL_loss: 23387657902835.828, 
	
5510/191900 (epoch 2) loss: 3.607, gen_loss: 11.668, Ret_loss 3.607, FS_loss 14.666, KL_loss: 23329097698174.344, 
	
5515/191900 (epoch 2) loss: 3.607, gen_loss: 11.669, Ret_loss 3.607, FS_loss 14.670, KL_loss: 23259898816352.828, 
	
5520/191900 (epoch 2) loss: 3.607, gen_loss: 11.670, Ret_loss 3.607, FS_loss 14.673, KL_loss: 23856567350340.250, 
	
5525/191900 (epoch 2) loss: 3.606, gen_loss: 11.672, Ret_loss 3.606, FS_loss 14.677, KL_loss: 23785941392329.508, 
	
5530/191900 (epoch 2) loss: 3.605, gen_loss: 11.673, Ret_loss 3.605, FS_loss 14.680, KL_loss: 23715706725827.770, 
	
5535/191900 (epoch 2) loss: 3.605, gen_loss: 11.674, Ret_loss 3.605, FS_loss 14.685, KL_loss: 23654463675833.996, 
	
5540/191900 (epoch 2) loss: 3.604, gen_loss: 11.676, Ret_loss 3.604, FS_loss 14.688, KL_loss: 23585050498180.539, 
	
5545/191900 (epoch 2) loss: 3.604, gen_loss: 11.677, Ret_loss 3.604, FS_loss 14.692, KL_loss: 23516031074039.559, 
	
5550/191900 (epoch 2) loss: 3.604, gen_loss: 11.678, Ret_loss 3.604, FS_loss 14.695, KL_loss: 23448941154984.828, 
	
5555/191900 (epoch 2) loss: 3.603, gen_loss: 11.680, Ret_loss 3.603, FS_loss 14.699, KL_loss: 23380890637457.984, 
	
5560/191900 (epoch 2) loss: 3.603, gen_loss: 11.681, Ret_loss 3.603, FS_loss 14.703, KL_loss: 23313226743297.438, 
	
5565/191900 (epoch 2) loss: 3.602, gen_loss: 11.682, Ret_loss 3.602, FS_loss 14.707, KL_loss: 23264090689453.582, 
	
5570/191900 (epoch 2) loss: 3.602, gen_loss: 11.683, Ret_loss 3.602, FS_loss 14.710, KL_loss: 23197394709412.957, 
	
5575/191900 (epoch 2) loss: 3.601, gen_loss: 11.685, Ret_loss 3.601, FS_loss 14.714, KL_loss: 23135816016492.363, 
	
5580/191900 (epoch 2) loss: 3.601, gen_loss: 11.685, Ret_loss 3.601, FS_loss 14.717, KL_loss: 23080371648950.812, 
	
5585/191900 (epoch 2) loss: 3.600, gen_loss: 11.686, Ret_loss 3.600, FS_loss 14.720, KL_loss: 23015642106365.023, 
	
5590/191900 (epoch 2) loss: 3.599, gen_loss: 11.688, Ret_loss 3.599, FS_loss 14.724, KL_loss: 22953972968650.066, 
	
5595/191900 (epoch 2) loss: 3.599, gen_loss: 11.688, Ret_loss 3.599, FS_loss 14.726, KL_loss: 22905282899989.508, 
	
5600/191900 (epoch 2) loss: 3.599, gen_loss: 11.688, Ret_loss 3.599, FS_loss 14.729, KL_loss: 22844124563181.223, 
	
5605/191900 (epoch 2) loss: 3.598, gen_loss: 11.690, Ret_loss 3.598, FS_loss 14.733, KL_loss: 22780211807142.180, 
	
5610/191900 (epoch 2) loss: 3.598, gen_loss: 11.691, Ret_loss 3.598, FS_loss 14.737, KL_loss: 22718413203416.105, 
	
5615/191900 (epoch 2) loss: 3.597, gen_loss: 11.692, Ret_loss 3.597, FS_loss 14.740, KL_loss: 22707883281273.766, 
	
5620/191900 (epoch 2) loss: 3.596, gen_loss: 11.693, Ret_loss 3.596, FS_loss 14.743, KL_loss: 22646081313844.793, 
	
5625/191900 (epoch 2) loss: 3.596, gen_loss: 11.694, Ret_loss 3.596, FS_loss 14.747, KL_loss: 22584131732123.160, 
	
5630/191900 (epoch 2) loss: 3.595, gen_loss: 11.695, Ret_loss 3.595, FS_loss 14.749, KL_loss: 22615317750786.238, 
	
5635/191900 (epoch 2) loss: 3.595, gen_loss: 11.696, Ret_loss 3.595, FS_loss 14.753, KL_loss: 22552809351511.379, 
	
5640/191900 (epoch 2) loss: 3.594, gen_loss: 11.697, Ret_loss 3.594, FS_loss 14.756, KL_loss: 22490431049125.367, 
	
5645/191900 (epoch 2) loss: 3.594, gen_loss: 11.697, Ret_loss 3.594, FS_loss 14.759, KL_loss: 22433995053431.461, 
	
5650/191900 (epoch 2) loss: 3.593, gen_loss: 11.698, Ret_loss 3.593, FS_loss 14.762, KL_loss: 22372269951051.074, 
	
5655/191900 (epoch 2) loss: 3.593, gen_loss: 11.699, Ret_loss 3.593, FS_loss 14.765, KL_loss: 22311106139487.992, 
	
5660/191900 (epoch 2) loss: 3.593, gen_loss: 11.700, Ret_loss 3.593, FS_loss 14.769, KL_loss: 22915217997822.270, 
	
5665/191900 (epoch 2) loss: 3.592, gen_loss: 11.701, Ret_loss 3.592, FS_loss 14.772, KL_loss: 22852569319738.215, 
	
5670/191900 (epoch 2) loss: 3.591, gen_loss: 11.702, Ret_loss 3.591, FS_loss 14.775, KL_loss: 22790359282545.500, 
	
5675/191900 (epoch 2) loss: 3.591, gen_loss: 11.702, Ret_loss 3.591, FS_loss 14.777, KL_loss: 22729900587075.926, 
	
5680/191900 (epoch 2) loss: 3.590, gen_loss: 11.703, Ret_loss 3.590, FS_loss 14.781, KL_loss: 22668437379867.598, 
	
5685/191900 (epoch 2) loss: 3.590, gen_loss: 11.704, Ret_loss 3.590, FS_loss 14.784, KL_loss: 22634239870201.309, 
	
5690/191900 (epoch 2) loss: 3.589, gen_loss: 11.705, Ret_loss 3.589, FS_loss 14.788, KL_loss: 22574451478274.859, 
	
5695/191900 (epoch 2) loss: 3.589, gen_loss: 11.706, Ret_loss 3.589, FS_loss 14.791, KL_loss: 22513924922202.617, 
	
5700/191900 (epoch 2) loss: 3.589, gen_loss: 11.706, Ret_loss 3.589, FS_loss 14.794, KL_loss: 22454674089177.070, 
	
5705/191900 (epoch 2) loss: 3.588, gen_loss: 11.707, Ret_loss 3.588, FS_loss 14.798, KL_loss: 22409914578945.055, 
	
5710/191900 (epoch 2) loss: 3.588, gen_loss: 11.708, Ret_loss 3.588, FS_loss 14.801, KL_loss: 22350693619329.254, 
	
5715/191900 (epoch 2) loss: 3.587, gen_loss: 11.709, Ret_loss 3.587, FS_loss 14.804, KL_loss: 22295096504888.121, 
	
5720/191900 (epoch 2) loss: 3.587, gen_loss: 11.709, Ret_loss 3.587, FS_loss 14.807, KL_loss: 22242655074939.133, 
	
5725/191900 (epoch 2) loss: 3.586, gen_loss: 11.710, Ret_loss 3.586, FS_loss 14.810, KL_loss: 22201691347235.754, 
	
5730/191900 (epoch 2) loss: 3.586, gen_loss: 11.710, Ret_loss 3.586, FS_loss 14.813, KL_loss: 22143559818546.672, 
	
5735/191900 (epoch 2) loss: 3.585, gen_loss: 11.711, Ret_loss 3.585, FS_loss 14.815, KL_loss: 22085915003301.859, 
	
5740/191900 (epoch 2) loss: 3.584, gen_loss: 11.711, Ret_loss 3.584, FS_loss 14.819, KL_loss: 22034429999560.266, 
	
5745/191900 (epoch 2) loss: 3.583, gen_loss: 11.711, Ret_loss 3.583, FS_loss 14.821, KL_loss: 21976923512721.402, 
	
5750/191900 (epoch 2) loss: 3.582, gen_loss: 11.712, Ret_loss 3.582, FS_loss 14.823, KL_loss: 21921321585907.512, 
	
5755/191900 (epoch 2) loss: 3.582, gen_loss: 11.712, Ret_loss 3.582, FS_loss 14.826, KL_loss: 21893794134382.207, 
	
5760/191900 (epoch 3) loss: 3.527, gen_loss: 11.961, Ret_loss 3.527, FS_loss 15.884, KL_loss: 195034038272.000, 
	
5765/191900 (epoch 3) loss: 3.460, gen_loss: 11.876, Ret_loss 3.460, FS_loss 15.831, KL_loss: 1160113992135.111, 
	
5770/191900 (epoch 3) loss: 3.409, gen_loss: 11.887, Ret_loss 3.409, FS_loss 15.908, KL_loss: 106058913185499.422, 
	
5775/191900 (epoch 3) loss: 3.377, gen_loss: 11.913, Ret_loss 3.377, FS_loss 15.969, KL_loss: 78155274673098.109, 
	
5780/191900 (epoch 3) loss: 3.375, gen_loss: 11.900, Ret_loss 3.375, FS_loss 15.944, KL_loss: 11493882987753026.000, 
	
5785/191900 (epoch 3) loss: 3.374, gen_loss: 11.907, Ret_loss 3.374, FS_loss 15.959, KL_loss: 9512179034208984.000, 
	
5790/191900 (epoch 3) loss: 3.357, gen_loss: 11.920, Ret_loss 3.357, FS_loss 15.984, KL_loss: 8113329181875352.000, 
	
5795/191900 (epoch 3) loss: 3.355, gen_loss: 11.940, Ret_loss 3.355, FS_loss 16.015, KL_loss: 7073158795425247.000, 
	
5800/191900 (epoch 3) loss: 3.369, gen_loss: 11.961, Ret_loss 3.369, FS_loss 16.042, KL_loss: 6269409566549798.000, 
	
5805/191900 (epoch 3) loss: 3.366, gen_loss: 11.945, Ret_loss 3.366, FS_loss 16.024, KL_loss: 5629673935481409.000, 
	
5810/191900 (epoch 3) loss: 3.375, gen_loss: 11.955, Ret_loss 3.375, FS_loss 16.034, KL_loss: 5108407853579745.000, 
	
5815/191900 (epoch 3) loss: 3.389, gen_loss: 11.969, Ret_loss 3.389, FS_loss 16.053, KL_loss: 4675491989042569.000, 
	
5820/191900 (epoch 3) loss: 3.390, gen_loss: 11.985, Ret_loss 3.390, FS_loss 16.074, KL_loss: 4310225480772994.500, 
	
5825/191900 (epoch 3) loss: 3.395, gen_loss: 11.967, Ret_loss 3.395, FS_loss 16.041, KL_loss: 3997890720155773.000, 
	
5830/191900 (epoch 3) loss: 3.391, gen_loss: 11.972, Ret_loss 3.391, FS_loss 16.040, KL_loss: 3727763089675793.500, 
	
5835/191900 (epoch 3) loss: 3.399, gen_loss: 11.983, Ret_loss 3.399, FS_loss 16.044, KL_loss: 3491828867768563.500, 
	
5840/191900 (epoch 3) loss: 3.391, gen_loss: 11.992, Ret_loss 3.391, FS_loss 16.046, KL_loss: 3283982885686933.500, 
	
5845/191900 (epoch 3) loss: 3.388, gen_loss: 12.010, Ret_loss 3.388, FS_loss 16.060, KL_loss: 3099520414319815.000, 
	
5850/191900 (epoch 3) loss: 3.382, gen_loss: 12.016, Ret_loss 3.382, FS_loss 16.061, KL_loss: 2934653425786098.500, 
	
5855/191900 (epoch 3) loss: 3.374, gen_loss: 12.014, Ret_loss 3.374, FS_loss 16.055, KL_loss: 2786439487839338.500, 
	
5860/191900 (epoch 3) loss: 3.372, gen_loss: 12.019, Ret_loss 3.372, FS_loss 16.050, KL_loss: 2652478230312027.500, 
	
5865/191900 (epoch 3) loss: 3.373, gen_loss: 12.043, Ret_loss 3.373, FS_loss 16.073, KL_loss: 2530952214435420.000, 
	
5870/191900 (epoch 3) loss: 3.367, gen_loss: 12.042, Ret_loss 3.367, FS_loss 16.069, KL_loss: 2419991276480487.500, 
	
5875/191900 (epoch 3) loss: 3.378, gen_loss: 12.058, Ret_loss 3.378, FS_loss 16.083, KL_loss: 2318314676871385.500, 
	
5880/191900 (epoch 3) loss: 3.380, gen_loss: 12.066, Ret_loss 3.380, FS_loss 16.086, KL_loss: 2224840904098000.750, 
	
5885/191900 (epoch 3) loss: 3.381, gen_loss: 12.064, Ret_loss 3.381, FS_loss 16.074, KL_loss: 2138701570993900.500, 
	
5890/191900 (epoch 3) loss: 3.380, gen_loss: 12.077, Ret_loss 3.380, FS_loss 16.089, KL_loss: 2063007196566492.000, 
	
5895/191900 (epoch 3) loss: 3.380, gen_loss: 12.081, Ret_loss 3.380, FS_loss 16.085, KL_loss: 1988853339527103.750, 
	
5900/191900 (epoch 3) loss: 3.381, gen_loss: 12.082, Ret_loss 3.381, FS_loss 16.078, KL_loss: 1919809456299529.000, 
	
5905/191900 (epoch 3) loss: 3.380, gen_loss: 12.094, Ret_loss 3.380, FS_loss 16.087, KL_loss: 1855418265782267.000, 
	
5910/191900 (epoch 3) loss: 3.382, gen_loss: 12.105, Ret_loss 3.382, FS_loss 16.099, KL_loss: 1796616701055516.500, 
	
5915/191900 (epoch 3) loss: 3.378, gen_loss: 12.106, Ret_loss 3.378, FS_loss 16.095, KL_loss: 1740208691473538.500, 
	
5920/191900 (epoch 3) loss: 3.378, gen_loss: 12.104, Ret_loss 3.378, FS_loss 16.089, KL_loss: 1687194350238103.500, 
	
5925/191900 (epoch 3) loss: 3.379, gen_loss: 12.115, Ret_loss 3.379, FS_loss 16.096, KL_loss: 1637316464082515.500, 
	
5930/191900 (epoch 3) loss: 3.375, gen_loss: 12.116, Ret_loss 3.375, FS_loss 16.093, KL_loss: 1592129882001792.250, 
	
5935/191900 (epoch 3) loss: 3.377, gen_loss: 12.121, Ret_loss 3.377, FS_loss 16.094, KL_loss: 1547807294723954.500, 
	
5940/191900 (epoch 3) loss: 3.371, gen_loss: 12.127, Ret_loss 3.371, FS_loss 16.100, KL_loss: 1505761735128427.250, 
	
5945/191900 (epoch 3) loss: 3.367, gen_loss: 12.129, Ret_loss 3.367, FS_loss 16.098, KL_loss: 1465952685167140.750, 
	
5950/191900 (epoch 3) loss: 3.366, gen_loss: 12.137, Ret_loss 3.366, FS_loss 16.099, KL_loss: 1433954072766660.750, 
	
5955/191900 (epoch 3) loss: 3.368, gen_loss: 12.139, Ret_loss 3.368, FS_loss 16.098, KL_loss: 1397937608966932.750, 
	
5960/191900 (epoch 3) loss: 3.370, gen_loss: 12.143, Ret_loss 3.370, FS_loss 16.104, KL_loss: 1363679482645932.000, 
	
5965/191900 (epoch 3) loss: 3.369, gen_loss: 12.149, Ret_loss 3.369, FS_loss 16.109, KL_loss: 1331063889584212.750, 
	
5970/191900 (epoch 3) loss: 3.370, gen_loss: 12.152, Ret_loss 3.370, FS_loss 16.105, KL_loss: 1299994815668345.000, 
	
5975/191900 (epoch 3) loss: 3.370, gen_loss: 12.156, Ret_loss 3.370, FS_loss 16.107, KL_loss: 1271373925650868.250, 
	
5980/191900 (epoch 3) loss: 3.371, gen_loss: 12.163, Ret_loss 3.371, FS_loss 16.114, KL_loss: 1243006698072545.250, 
	
5985/191900 (epoch 3) loss: 3.372, gen_loss: 12.162, Ret_loss 3.372, FS_loss 16.109, KL_loss: 1215874823757972.750, 
	
5990/191900 (epoch 3) loss: 3.375, gen_loss: 12.168, Ret_loss 3.375, FS_loss 16.110, KL_loss: 1189976596121553.000, 
	
5995/191900 (epoch 3) loss: 3.375, gen_loss: 12.169, Ret_loss 3.375, FS_loss 16.110, KL_loss: 2363206717721515.500, 
	
6000/191900 (epoch 3) loss: 3.375, gen_loss: 12.175, Ret_loss 3.375, FS_loss 16.116, KL_loss: 2314793149869111.500, 
	
6005/191900 (epoch 3) loss: 3.376, gen_loss: 12.179, Ret_loss 3.376, FS_loss 16.120, KL_loss: 2268329979086154.000, 
	
6010/191900 (epoch 3) loss: 3.371, gen_loss: 12.184, Ret_loss 3.371, FS_loss 16.126, KL_loss: 2224098445189866.750, 
	
6015/191900 (epoch 3) loss: 3.372, gen_loss: 12.189, Ret_loss 3.372, FS_loss 16.130, KL_loss: 2182747446981008.250, 
	
6020/191900 (epoch 3) loss: 3.370, gen_loss: 12.193, Ret_loss 3.370, FS_loss 16.135, KL_loss: 2141411635635298.000, 
	
6025/191900 (epoch 3) loss: 3.371, gen_loss: 12.198, Ret_loss 3.371, FS_loss 16.137, KL_loss: 2101611528352555.750, 
	
6030/191900 (epoch 3) loss: 3.372, gen_loss: 12.202, Ret_loss 3.372, FS_loss 16.143, KL_loss: 2063271972832133.500, 
	
6035/191900 (epoch 3) loss: 3.370, gen_loss: 12.204, Ret_loss 3.370, FS_loss 16.144, KL_loss: 2028006378164713.000, 
	
6040/191900 (epoch 3) loss: 3.370, gen_loss: 12.207, Ret_loss 3.370, FS_loss 16.150, KL_loss: 1992336680648420.000, 
	
6045/191900 (epoch 3) loss: 3.370, gen_loss: 12.211, Ret_loss 3.370, FS_loss 16.152, KL_loss: 1957881087183752.500, 
	
6050/191900 (epoch 3) loss: 3.367, gen_loss: 12.216, Ret_loss 3.367, FS_loss 16.160, KL_loss: 1924609619857273.000, 
	
6055/191900 (epoch 3) loss: 3.369, gen_loss: 12.219, Ret_loss 3.369, FS_loss 16.163, KL_loss: 1892489086429359.500, 
	
6060/191900 (epoch 3) loss: 3.369, gen_loss: 12.220, Ret_loss 3.369, FS_loss 16.162, KL_loss: 1861400915175913.250, 
	
6065/191900 (epoch 3) loss: 3.365, gen_loss: 12.221, Ret_loss 3.365, FS_loss 16.163, KL_loss: 1831818532070997.250, 
	
6070/191900 (epoch 3) loss: 3.364, gen_loss: 12.221, Ret_loss 3.364, FS_loss 16.162, KL_loss: 1805871297895930.250, 
	
6075/191900 (epoch 3) loss: 3.363, gen_loss: 12.223, Ret_loss 3.363, FS_loss 16.167, KL_loss: 1777724295177865.250, 
	
6080/191900 (epoch 3) loss: 3.360, gen_loss: 12.226, Ret_loss 3.360, FS_loss 16.171, KL_loss: 1750292748459050.000, 
	
6085/191900 (epoch 3) loss: 3.361, gen_loss: 12.226, Ret_loss 3.361, FS_loss 16.170, KL_loss: 1723694740824416.500, 
	
6090/191900 (epoch 3) loss: 3.358, gen_loss: 12.233, Ret_loss 3.358, FS_loss 16.180, KL_loss: 1697895306206034.000, 
	
6095/191900 (epoch 3) loss: 3.360, gen_loss: 12.233, Ret_loss 3.360, FS_loss 16.179, KL_loss: 1672863208969633.500, 
	
6100/191900 (epoch 3) loss: 3.361, gen_loss: 12.236, Ret_loss 3.361, FS_loss 16.182, KL_loss: 1648571072757501.750, 
	
6105/191900 (epoch 3) loss: 3.360, gen_loss: 12.239, Ret_loss 3.360, FS_loss 16.186, KL_loss: 1625150275711437.500, 
	
6110/191900 (epoch 3) loss: 3.360, gen_loss: 12.240, Ret_loss 3.360, FS_loss 16.187, KL_loss: 1602520356716848.500, 
	
6115/191900 (epoch 3) loss: 3.361, gen_loss: 12.243, Ret_loss 3.361, FS_loss 16.190, KL_loss: 1580215239062842.500, 
	
6120/191900 (epoch 3) loss: 3.362, gen_loss: 12.248, Ret_loss 3.362, FS_loss 16.196, KL_loss: 1558516162364588.250, 
	
6125/191900 (epoch 3) loss: 3.363, gen_loss: 12.249, Ret_loss 3.363, FS_loss 16.196, KL_loss: 1537414682170379.750, 
	
6130/191900 (epoch 3) loss: 3.362, gen_loss: 12.249, Ret_loss 3.362, FS_loss 16.196, KL_loss: 1517062293281483.250, 
	
6135/191900 (epoch 3) loss: 3.361, gen_loss: 12.248, Ret_loss 3.361, FS_loss 16.196, KL_loss: 1497125941327913.250, 
	
6140/191900 (epoch 3) loss: 3.361, gen_loss: 12.247, Ret_loss 3.361, FS_loss 16.198, KL_loss: 1477635010642883.250, 
	
6145/191900 (epoch 3) loss: 3.360, gen_loss: 12.247, Ret_loss 3.360, FS_loss 16.200, KL_loss: 1458646622942608.750, 
	
6150/191900 (epoch 3) loss: 3.360, gen_loss: 12.248, Ret_loss 3.360, FS_loss 16.202, KL_loss: 1440146585232881.000, 
	
6155/191900 (epoch 3) loss: 3.360, gen_loss: 12.246, Ret_loss 3.360, FS_loss 16.203, KL_loss: 1422139858947514.000, 
	
6160/191900 (epoch 3) loss: 3.359, gen_loss: 12.248, Ret_loss 3.359, FS_loss 16.205, KL_loss: 1404628219151211.000, 
	
6165/191900 (epoch 3) loss: 3.360, gen_loss: 12.250, Ret_loss 3.360, FS_loss 16.208, KL_loss: 1387462844864720.500, 
	
6170/191900 (epoch 3) loss: 3.360, gen_loss: 12.249, Ret_loss 3.360, FS_loss 16.207, KL_loss: 1370715227592558.750, 
	
6175/191900 (epoch 3) loss: 3.360, gen_loss: 12.247, Ret_loss 3.360, FS_loss 16.206, KL_loss: 1354377562513528.250, 
	
6180/191900 (epoch 3) loss: 3.359, gen_loss: 12.249, Ret_loss 3.359, FS_loss 16.210, KL_loss: 1341905336745349.500, 
	
6185/191900 (epoch 3) loss: 3.358, gen_loss: 12.247, Ret_loss 3.358, FS_loss 16.209, KL_loss: 1326266760203479.500, 
	
6190/191900 (epoch 3) loss: 3.358, gen_loss: 12.249, Ret_loss 3.358, FS_loss 16.213, KL_loss: 1310987997531304.000, 
	
6195/191900 (epoch 3) loss: 3.357, gen_loss: 12.249, Ret_loss 3.357, FS_loss 16.214, KL_loss: 1296058912497545.500, 
	
6200/191900 (epoch 3) loss: 3.357, gen_loss: 12.250, Ret_loss 3.357, FS_loss 16.217, KL_loss: 1281632949645250.250, 
	
6205/191900 (epoch 3) loss: 3.358, gen_loss: 12.250, Ret_loss 3.358, FS_loss 16.216, KL_loss: 1267368726157894.250, 
	
6210/191900 (epoch 3) loss: 3.358, gen_loss: 12.248, Ret_loss 3.358, FS_loss 16.216, KL_loss: 1253412735930361.750, 
	
6215/191900 (epoch 3) loss: 3.357, gen_loss: 12.247, Ret_loss 3.357, FS_loss 16.213, KL_loss: 1239761769516005.750, 
	
6220/191900 (epoch 3) loss: 3.357, gen_loss: 12.249, Ret_loss 3.357, FS_loss 16.218, KL_loss: 1226419553694343.250, 
	
6225/191900 (epoch 3) loss: 3.359, gen_loss: 12.251, Ret_loss 3.359, FS_loss 16.219, KL_loss: 1213394135011645.250, 
	
6230/191900 (epoch 3) loss: 3.359, gen_loss: 12.251, Ret_loss 3.359, FS_loss 16.221, KL_loss: 1200595969102906.750, 
	
6235/191900 (epoch 3) loss: 3.358, gen_loss: 12.253, Ret_loss 3.358, FS_loss 16.224, KL_loss: 1188065448704451.500, 
	
6240/191900 (epoch 3) loss: 3.357, gen_loss: 12.251, Ret_loss 3.357, FS_loss 16.223, KL_loss: 1175798299590938.000, 
	
6245/191900 (epoch 3) loss: 3.356, gen_loss: 12.251, Ret_loss 3.356, FS_loss 16.224, KL_loss: 1163797311453232.750, 
	
6250/191900 (epoch 3) loss: 3.356, gen_loss: 12.251, Ret_loss 3.356, FS_loss 16.223, KL_loss: 1152036200688928.750, 
	
6255/191900 (epoch 3) loss: 3.354, gen_loss: 12.250, Ret_loss 3.354, FS_loss 16.224, KL_loss: 1140516224096262.750, 
	
6260/191900 (epoch 3) loss: 3.354, gen_loss: 12.251, Ret_loss 3.354, FS_loss 16.225, KL_loss: 1129273215765303.250, 
	
6265/191900 (epoch 3) loss: 3.353, gen_loss: 12.252, Ret_loss 3.353, FS_loss 16.230, KL_loss: 1118685459857531.250, 
	
6270/191900 (epoch 3) loss: 3.352, gen_loss: 12.250, Ret_loss 3.352, FS_loss 16.228, KL_loss: 1107803737782653.000, 
	
6275/191900 (epoch 3) loss: 3.351, gen_loss: 12.250, Ret_loss 3.351, FS_loss 16.230, KL_loss: 1097131673257911.500, 
	
6280/191900 (epoch 3) loss: 3.351, gen_loss: 12.252, Ret_loss 3.351, FS_loss 16.236, KL_loss: 1086664603663714.250, 
	
6285/191900 (epoch 3) loss: 3.352, gen_loss: 12.251, Ret_loss 3.352, FS_loss 16.236, KL_loss: 1076433522932693.875, 
	
6290/191900 (epoch 3) loss: 3.351, gen_loss: 12.249, Ret_loss 3.351, FS_loss 16.235, KL_loss: 1066357543757726.625, 
	
6295/191900 (epoch 3) loss: 3.349, gen_loss: 12.247, Ret_loss 3.349, FS_loss 16.236, KL_loss: 1056466731258823.500, 
	
6300/191900 (epoch 3) loss: 3.349, gen_loss: 12.247, Ret_loss 3.349, FS_loss 16.239, KL_loss: 1046758598143083.750, 
	
6305/191900 (epoch 3) loss: 3.348, gen_loss: 12.244, Ret_loss 3.348, FS_loss 16.237, KL_loss: 1037278483142080.125, 
	
6310/191900 (epoch 3) loss: 3.346, gen_loss: 12.242, Ret_loss 3.346, FS_loss 16.238, KL_loss: 1027923262945629.750, 
	
6315/191900 (epoch 3) loss: 3.347, gen_loss: 12.242, Ret_loss 3.347, FS_loss 16.242, KL_loss: 1018730656152884.250, 
	
6320/191900 (epoch 3) loss: 3.346, gen_loss: 12.240, Ret_loss 3.346, FS_loss 16.244, KL_loss: 1009701969664583.250, 
	
6325/191900 (epoch 3) loss: 3.347, gen_loss: 12.240, Ret_loss 3.347, FS_loss 16.245, KL_loss: 1000863056610966.750, 
	
6330/191900 (epoch 3) loss: 3.346, gen_loss: 12.238, Ret_loss 3.346, FS_loss 16.247, KL_loss: 992177618180562.125, 
	
6335/191900 (epoch 3) loss: 3.346, gen_loss: 12.236, Ret_loss 3.346, FS_loss 16.247, KL_loss: 983611307979100.875, 
	
6340/191900 (epoch 3) loss: 3.345, gen_loss: 12.233, Ret_loss 3.345, FS_loss 16.246, KL_loss: 975193382891620.375, 
	
6345/191900 (epoch 3) loss: 3.344, gen_loss: 12.235, Ret_loss 3.344, FS_loss 16.251, KL_loss: 966991771788712.625, 
	
6350/191900 (epoch 3) loss: 3.344, gen_loss: 12.234, Ret_loss 3.344, FS_loss 16.253, KL_loss: 958982542293759.625, 
	
6355/191900 (epoch 3) loss: 3.343, gen_loss: 12.232, Ret_loss 3.343, FS_loss 16.255, KL_loss: 950980589669027.625, 
	
6360/191900 (epoch 3) loss: 3.343, gen_loss: 12.230, Ret_loss 3.343, FS_loss 16.257, KL_loss: 943112766288403.125, 
	
6365/191900 (epoch 3) loss: 3.343, gen_loss: 12.229, Ret_loss 3.343, FS_loss 16.258, KL_loss: 936552884943162.875, 
	
6370/191900 (epoch 3) loss: 3.342, gen_loss: 12.225, Ret_loss 3.342, FS_loss 16.256, KL_loss: 929224258842119.125, 
	
6375/191900 (epoch 3) loss: 3.341, gen_loss: 12.223, Ret_loss 3.341, FS_loss 16.256, KL_loss: 921719677684749.625, 
	
6380/191900 (epoch 3) loss: 3.340, gen_loss: 12.222, Ret_loss 3.340, FS_loss 16.258, KL_loss: 914335430639867.500, 
	
6385/191900 (epoch 3) loss: 3.340, gen_loss: 12.220, Ret_loss 3.340, FS_loss 16.258, KL_loss: 907071061310513.250, 
	
6390/191900 (epoch 3) loss: 3.342, gen_loss: 12.219, Ret_loss 3.342, FS_loss 16.261, KL_loss: 899930960450649.250, 
	
6395/191900 (epoch 3) loss: 3.342, gen_loss: 12.218, Ret_loss 3.342, FS_loss 16.262, KL_loss: 897363744781283.500, 
	
6400/191900 (epoch 3) loss: 3.342, gen_loss: 12.216, Ret_loss 3.342, FS_loss 16.264, KL_loss: 890396743263247.500, 
	
6405/191900 (epoch 3) loss: 3.342, gen_loss: 12.215, Ret_loss 3.342, FS_loss 16.264, KL_loss: 883537032130147.000, 
	
6410/191900 (epoch 3) loss: 3.341, gen_loss: 12.213, Ret_loss 3.341, FS_loss 16.266, KL_loss: 876782279468426.125, 
	
6415/191900 (epoch 3) loss: 3.341, gen_loss: 12.212, Ret_loss 3.341, FS_loss 16.268, KL_loss: 870134662626180.875, 
	
6420/191900 (epoch 3) loss: 3.340, gen_loss: 12.210, Ret_loss 3.340, FS_loss 16.268, KL_loss: 863600831828285.250, 
	
6425/191900 (epoch 3) loss: 3.341, gen_loss: 12.207, Ret_loss 3.341, FS_loss 16.266, KL_loss: 857147122325246.500, 
	
6430/191900 (epoch 3) loss: 3.340, gen_loss: 12.204, Ret_loss 3.340, FS_loss 16.264, KL_loss: 850789652068439.750, 
	
6435/191900 (epoch 3) loss: 3.340, gen_loss: 12.204, Ret_loss 3.340, FS_loss 16.266, KL_loss: 844531168072949.500, 
	
6440/191900 (epoch 3) loss: 3.339, gen_loss: 12.203, Ret_loss 3.339, FS_loss 16.269, KL_loss: 839382296441942.500, 
	
6445/191900 (epoch 3) loss: 3.339, gen_loss: 12.202, Ret_loss 3.339, FS_loss 16.271, KL_loss: 833291823053465.500, 
	
6450/191900 (epoch 3) loss: 3.338, gen_loss: 12.202, Ret_loss 3.338, FS_loss 16.274, KL_loss: 827288917175820.875, 
	
6455/191900 (epoch 3) loss: 3.339, gen_loss: 12.200, Ret_loss 3.339, FS_loss 16.272, KL_loss: 821373154274650.875, 
	
6460/191900 (epoch 3) loss: 3.338, gen_loss: 12.199, Ret_loss 3.338, FS_loss 16.274, KL_loss: 815564159826975.625, 
	
6465/191900 (epoch 3) loss: 3.338, gen_loss: 12.197, Ret_loss 3.338, FS_loss 16.275, KL_loss: 809898947636476.375, 
	
6470/191900 (epoch 3) loss: 3.338, gen_loss: 12.196, Ret_loss 3.338, FS_loss 16.276, KL_loss: 804230229900333.500, 
	
6475/191900 (epoch 3) loss: 3.337, gen_loss: 12.195, Ret_loss 3.337, FS_loss 16.277, KL_loss: 798639362246074.625, 
	
6480/191900 (epoch 3) loss: 3.337, gen_loss: 12.195, Ret_loss 3.337, FS_loss 16.279, KL_loss: 793125645178560.000, 
	
6485/191900 (epoch 3) loss: 3.338, gen_loss: 12.195, Ret_loss 3.338, FS_loss 16.282, KL_loss: 787691936749882.250, 
	
6490/191900 (epoch 3) loss: 3.338, gen_loss: 12.194, Ret_loss 3.338, FS_loss 16.282, KL_loss: 782519419470791.875, 
	
6495/191900 (epoch 3) loss: 3.338, gen_loss: 12.193, Ret_loss 3.338, FS_loss 16.285, KL_loss: 783207455850659.125, 
	
6500/191900 (epoch 3) loss: 3.337, gen_loss: 12.194, Ret_loss 3.337, FS_loss 16.288, KL_loss: 778638969373450.625, 
	
6505/191900 (epoch 3) loss: 3.336, gen_loss: 12.193, Ret_loss 3.336, FS_loss 16.290, KL_loss: 773443806937599.000, 
	
6510/191900 (epoch 3) loss: 3.336, gen_loss: 12.193, Ret_loss 3.336, FS_loss 16.292, KL_loss: 768315345323893.125, 
	
6515/191900 (epoch 3) loss: 3.336, gen_loss: 12.193, Ret_loss 3.336, FS_loss 16.294, KL_loss: 763255138689981.500, 
	
6520/191900 (epoch 3) loss: 3.335, gen_loss: 12.192, Ret_loss 3.335, FS_loss 16.294, KL_loss: 758998423603465.000, 
	
6525/191900 (epoch 3) loss: 3.335, gen_loss: 12.192, Ret_loss 3.335, FS_loss 16.296, KL_loss: 754066037001336.875, 
	
6530/191900 (epoch 3) loss: 3.335, gen_loss: 12.191, Ret_loss 3.335, FS_loss 16.296, KL_loss: 749195412394139.750, 
	
6535/191900 (epoch 3) loss: 3.333, gen_loss: 12.190, Ret_loss 3.333, FS_loss 16.297, KL_loss: 744387923401108.500, 
	
6540/191900 (epoch 3) loss: 3.333, gen_loss: 12.191, Ret_loss 3.333, FS_loss 16.299, KL_loss: 739721638737300.625, 
	
6545/191900 (epoch 3) loss: 3.333, gen_loss: 12.191, Ret_loss 3.333, FS_loss 16.301, KL_loss: 735041119819661.500, 
	
6550/191900 (epoch 3) loss: 3.333, gen_loss: 12.193, Ret_loss 3.333, FS_loss 16.305, KL_loss: 730415595127699.375, 
	
6555/191900 (epoch 3) loss: 3.332, gen_loss: 12.193, Ret_loss 3.332, FS_loss 16.305, KL_loss: 725851170070771.125, 
	
6560/191900 (epoch 3) loss: 3.331, gen_loss: 12.194, Ret_loss 3.331, FS_loss 16.307, KL_loss: 721341120130529.125, 
	
6565/191900 (epoch 3) loss: 3.331, gen_loss: 12.195, Ret_loss 3.331, FS_loss 16.308, KL_loss: 716884871519240.500, 
	
6570/191900 (epoch 3) loss: 3.331, gen_loss: 12.196, Ret_loss 3.331, FS_loss 16.309, KL_loss: 712484277263324.500, 
	
6575/191900 (epoch 3) loss: 3.331, gen_loss: 12.197, Ret_loss 3.331, FS_loss 16.312, KL_loss: 708139742338449.000, 
	
6580/191900 (epoch 3) loss: 3.331, gen_loss: 12.197, Ret_loss 3.331, FS_loss 16.311, KL_loss: 703851528560209.750, 
	
6585/191900 (epoch 3) loss: 3.331, gen_loss: 12.199, Ret_loss 3.331, FS_loss 16.314, KL_loss: 699608880660427.750, 
	
6590/191900 (epoch 3) loss: 3.331, gen_loss: 12.200, Ret_loss 3.331, FS_loss 16.315, KL_loss: 695416450555734.250, 
	
6595/191900 (epoch 3) loss: 3.330, gen_loss: 12.203, Ret_loss 3.330, FS_loss 16.318, KL_loss: 691277710914202.125, 
	
6600/191900 (epoch 3) loss: 3.330, gen_loss: 12.205, Ret_loss 3.330, FS_loss 16.321, KL_loss: 687207121360466.250, 
	
6605/191900 (epoch 3) loss: 3.329, gen_loss: 12.205, Ret_loss 3.329, FS_loss 16.322, KL_loss: 683166871680068.500, 
	
6610/191900 (epoch 3) loss: 3.330, gen_loss: 12.207, Ret_loss 3.330, FS_loss 16.323, KL_loss: 679170957680282.375, 
	
6615/191900 (epoch 3) loss: 3.329, gen_loss: 12.209, Ret_loss 3.329, FS_loss 16.326, KL_loss: 675245858236024.750, 
	
6620/191900 (epoch 3) loss: 3.328, gen_loss: 12.210, Ret_loss 3.328, FS_loss 16.328, KL_loss: 671401320210211.250, 
	
6625/191900 (epoch 3) loss: 3.329, gen_loss: 12.210, Ret_loss 3.329, FS_loss 16.328, KL_loss: 689389102528869.875, 
	
6630/191900 (epoch 3) loss: 3.328, gen_loss: 12.211, Ret_loss 3.328, FS_loss 16.330, KL_loss: 685445886715296.750, 
	
6635/191900 (epoch 3) loss: 3.327, gen_loss: 12.212, Ret_loss 3.327, FS_loss 16.332, KL_loss: 681547012371093.375, 
	
6640/191900 (epoch 3) loss: 3.327, gen_loss: 12.212, Ret_loss 3.327, FS_loss 16.332, KL_loss: 677692404765315.750, 
	
6645/191900 (epoch 3) loss: 3.327, gen_loss: 12.213, Ret_loss 3.327, FS_loss 16.333, KL_loss: 674371292525631.125, 
	
6650/191900 (epoch 3) loss: 3.327, gen_loss: 12.215, Ret_loss 3.327, FS_loss 16.336, KL_loss: 670600685563491.375, 
	
6655/191900 (epoch 3) loss: 3.327, gen_loss: 12.216, Ret_loss 3.327, FS_loss 16.338, KL_loss: 666871226306518.750, 
	
6660/191900 (epoch 3) loss: 3.327, gen_loss: 12.216, Ret_loss 3.327, FS_loss 16.338, KL_loss: 663183411581942.625, 
	
6665/191900 (epoch 3) loss: 3.326, gen_loss: 12.217, Ret_loss 3.326, FS_loss 16.339, KL_loss: 659693144144441.750, 
	
6670/191900 (epoch 3) loss: 3.326, gen_loss: 12.218, Ret_loss 3.326, FS_loss 16.340, KL_loss: 656085417298614.375, 
	
6675/191900 (epoch 3) loss: 3.325, gen_loss: 12.217, Ret_loss 3.325, FS_loss 16.340, KL_loss: 652516219029318.750, 
	
6680/191900 (epoch 3) loss: 3.325, gen_loss: 12.218, Ret_loss 3.325, FS_loss 16.340, KL_loss: 648985989625155.375, 
	
6685/191900 (epoch 3) loss: 3.324, gen_loss: 12.219, Ret_loss 3.324, FS_loss 16.342, KL_loss: 645504616171711.500, 
	
6690/191900 (epoch 3) loss: 3.323, gen_loss: 12.219, Ret_loss 3.323, FS_loss 16.344, KL_loss: 642243015291072.625, 
	
6695/191900 (epoch 3) loss: 3.323, gen_loss: 12.220, Ret_loss 3.323, FS_loss 16.345, KL_loss: 638823313187271.625, 
	
6700/191900 (epoch 3) loss: 3.323, gen_loss: 12.221, Ret_loss 3.323, FS_loss 16.345, KL_loss: 635439842273646.375, 
	
6705/191900 (epoch 3) loss: 3.323, gen_loss: 12.221, Ret_loss 3.323, FS_loss 16.346, KL_loss: 632092433908016.000, 
	
6710/191900 (epoch 3) loss: 3.322, gen_loss: 12.222, Ret_loss 3.322, FS_loss 16.346, KL_loss: 640873579183022.125, 
	
6715/191900 (epoch 3) loss: 3.322, gen_loss: 12.222, Ret_loss 3.322, FS_loss 16.346, KL_loss: 637533126514303.375, 
	
6720/191900 (epoch 3) loss: 3.323, gen_loss: 12.222, Ret_loss 3.323, FS_loss 16.347, KL_loss: 634226987639618.625, 
	
6725/191900 (epoch 3) loss: 3.322, gen_loss: 12.223, Ret_loss 3.322, FS_loss 16.348, KL_loss: 630955796020962.375, 
	
6730/191900 (epoch 3) loss: 3.321, gen_loss: 12.223, Ret_loss 3.321, FS_loss 16.348, KL_loss: 627722518105314.875, 
	
6735/191900 (epoch 3) loss: 3.321, gen_loss: 12.224, Ret_loss 3.321, FS_loss 16.349, KL_loss: 624533409117663.875, 
	
6740/191900 (epoch 3) loss: 3.321, gen_loss: 12.224, Ret_loss 3.321, FS_loss 16.350, KL_loss: 621362738775116.750, 
	
6745/191900 (epoch 3) loss: 3.320, gen_loss: 12.225, Ret_loss 3.320, FS_loss 16.352, KL_loss: 618222339724885.125, 
	
6750/191900 (epoch 3) loss: 3.321, gen_loss: 12.226, Ret_loss 3.321, FS_loss 16.354, KL_loss: 615114132481534.750, 
	
6755/191900 (epoch 3) loss: 3.321, gen_loss: 12.227, Ret_loss 3.321, FS_loss 16.355, KL_loss: 612044021102148.875, 
	
6760/191900 (epoch 3) loss: 3.321, gen_loss: 12.227, Ret_loss 3.321, FS_loss 16.355, KL_loss: 609015555699652.625, 
	
6765/191900 (epoch 3) loss: 3.320, gen_loss: 12.229, Ret_loss 3.320, FS_loss 16.357, KL_loss: 606043527986341.125, 
	
6770/191900 (epoch 3) loss: 3.320, gen_loss: 12.231, Ret_loss 3.320, FS_loss 16.360, KL_loss: 603064293619257.250, 
	
6775/191900 (epoch 3) loss: 3.319, gen_loss: 12.232, Ret_loss 3.319, FS_loss 16.361, KL_loss: 600105897494982.000, 
	
6780/191900 (epoch 3) loss: 3.318, gen_loss: 12.233, Ret_loss 3.318, FS_loss 16.362, KL_loss: 597178986682953.750, 
	
6785/191900 (epoch 3) loss: 3.318, gen_loss: 12.235, Ret_loss 3.318, FS_loss 16.365, KL_loss: 594321204861401.500, 
	
6790/191900 (epoch 3) loss: 3.318, gen_loss: 12.236, Ret_loss 3.318, FS_loss 16.365, KL_loss: 591452563053698.500, 
	
6795/191900 (epoch 3) loss: 3.317, gen_loss: 12.237, Ret_loss 3.317, FS_loss 16.366, KL_loss: 588608056574671.250, 
	
6800/191900 (epoch 3) loss: 3.317, gen_loss: 12.239, Ret_loss 3.317, FS_loss 16.368, KL_loss: 585791458155423.625, 
	
6805/191900 (epoch 3) loss: 3.317, gen_loss: 12.239, Ret_loss 3.317, FS_loss 16.369, KL_loss: 583017074761729.750, 
	
6810/191900 (epoch 3) loss: 3.317, gen_loss: 12.240, Ret_loss 3.317, FS_loss 16.370, KL_loss: 580331127819994.375, 
	
6815/191900 (epoch 3) loss: 3.316, gen_loss: 12.242, Ret_loss 3.316, FS_loss 16.373, KL_loss: 577595462877131.500, 
	
6820/191900 (epoch 3) loss: 3.316, gen_loss: 12.244, Ret_loss 3.316, FS_loss 16.375, KL_loss: 574887800446030.625, 
	
6825/191900 (epoch 3) loss: 3.315, gen_loss: 12.245, Ret_loss 3.315, FS_loss 16.376, KL_loss: 572213702020880.250, 
	
6830/191900 (epoch 3) loss: 3.316, gen_loss: 12.247, Ret_loss 3.316, FS_loss 16.379, KL_loss: 569553684947121.125, 
	
6835/191900 (epoch 3) loss: 3.316, gen_loss: 12.249, Ret_loss 3.316, FS_loss 16.382, KL_loss: 566918654185955.750, 
	
6840/191900 (epoch 3) loss: 3.315, gen_loss: 12.250, Ret_loss 3.315, FS_loss 16.383, KL_loss: 564313078823911.250, 
	
6845/191900 (epoch 3) loss: 3.315, gen_loss: 12.249, Ret_loss 3.315, FS_loss 16.382, KL_loss: 561808443944657.000, 
	
6850/191900 (epoch 3) loss: 3.314, gen_loss: 12.250, Ret_loss 3.314, FS_loss 16.384, KL_loss: 559243914342461.562, 
	
6855/191900 (epoch 3) loss: 3.314, gen_loss: 12.252, Ret_loss 3.314, FS_loss 16.387, KL_loss: 556700661532958.750, 
	
6860/191900 (epoch 3) loss: 3.314, gen_loss: 12.254, Ret_loss 3.314, FS_loss 16.389, KL_loss: 554184291232005.312, 
	
6865/191900 (epoch 3) loss: 3.313, gen_loss: 12.255, Ret_loss 3.313, FS_loss 16.393, KL_loss: 551743746932848.438, 
	
6870/191900 (epoch 3) loss: 3.313, gen_loss: 12.257, Ret_loss 3.313, FS_loss 16.395, KL_loss: 549269926487613.375, 
	
6875/191900 (epoch 3) loss: 3.312, gen_loss: 12.258, Ret_loss 3.312, FS_loss 16.397, KL_loss: 546819384343516.062, 
	
6880/191900 (epoch 3) loss: 3.311, gen_loss: 12.259, Ret_loss 3.311, FS_loss 16.398, KL_loss: 544402103120580.562, 
	
6885/191900 (epoch 3) loss: 3.310, gen_loss: 12.259, Ret_loss 3.310, FS_loss 16.398, KL_loss: 541995309952035.125, 
	
6890/191900 (epoch 3) loss: 3.310, gen_loss: 12.260, Ret_loss 3.310, FS_loss 16.399, KL_loss: 539609341755790.875, 
	
6895/191900 (epoch 3) loss: 3.310, gen_loss: 12.261, Ret_loss 3.310, FS_loss 16.400, KL_loss: 537243717966607.750, 
	
6900/191900 (epoch 3) loss: 3.310, gen_loss: 12.263, Ret_loss 3.310, FS_loss 16.402, KL_loss: 534899314425564.000, 
	
6905/191900 (epoch 3) loss: 3.310, gen_loss: 12.263, Ret_loss 3.310, FS_loss 16.403, KL_loss: 532577431042507.625, 
	
6910/191900 (epoch 3) loss: 3.309, gen_loss: 12.265, Ret_loss 3.309, FS_loss 16.405, KL_loss: 530275324181187.875, 
	
6915/191900 (epoch 3) loss: 3.309, gen_loss: 12.266, Ret_loss 3.309, FS_loss 16.407, KL_loss: 528023091814345.000, 
	
6920/191900 (epoch 3) loss: 3.308, gen_loss: 12.267, Ret_loss 3.308, FS_loss 16.408, KL_loss: 525758743216038.062, 
	
6925/191900 (epoch 3) loss: 3.308, gen_loss: 12.269, Ret_loss 3.308, FS_loss 16.411, KL_loss: 523511161323248.250, 
	
6930/191900 (epoch 3) loss: 3.308, gen_loss: 12.270, Ret_loss 3.308, FS_loss 16.412, KL_loss: 521283333655586.688, 
	
6935/191900 (epoch 3) loss: 3.307, gen_loss: 12.271, Ret_loss 3.307, FS_loss 16.414, KL_loss: 519123552763551.188, 
	
6940/191900 (epoch 3) loss: 3.306, gen_loss: 12.272, Ret_loss 3.306, FS_loss 16.415, KL_loss: 516954336597221.812, 
	
6945/191900 (epoch 3) loss: 3.307, gen_loss: 12.273, Ret_loss 3.307, FS_loss 16.416, KL_loss: 514783830308329.812, 
	
6950/191900 (epoch 3) loss: 3.307, gen_loss: 12.274, Ret_loss 3.307, FS_loss 16.418, KL_loss: 512630250391488.312, 
	
6955/191900 (epoch 3) loss: 3.307, gen_loss: 12.275, Ret_loss 3.307, FS_loss 16.419, KL_loss: 510494798946073.188, 
	
6960/191900 (epoch 3) loss: 3.307, gen_loss: 12.276, Ret_loss 3.307, FS_loss 16.422, KL_loss: 508379868837277.125, 
	
6965/191900 (epoch 3) loss: 3.306, gen_loss: 12.278, Ret_loss 3.306, FS_loss 16.424, KL_loss: 506536883690898.125, 
	
6970/191900 (epoch 3) loss: 3.305, gen_loss: 12.279, Ret_loss 3.305, FS_loss 16.427, KL_loss: 504452152977615.312, 
	
6975/191900 (epoch 3) loss: 3.304, gen_loss: 12.280, Ret_loss 3.304, FS_loss 16.429, KL_loss: 502383257782093.688, 
	
6980/191900 (epoch 3) loss: 3.304, gen_loss: 12.282, Ret_loss 3.304, FS_loss 16.432, KL_loss: 500331526820624.500, 
	
6985/191900 (epoch 3) loss: 3.303, gen_loss: 12.282, Ret_loss 3.303, FS_loss 16.433, KL_loss: 498339474565539.750, 
	
6990/191900 (epoch 3) loss: 3.303, gen_loss: 12.282, Ret_loss 3.303, FS_loss 16.434, KL_loss: 496331797306085.625, 
	
6995/191900 (epoch 3) loss: 3.302, gen_loss: 12.282, Ret_loss 3.302, FS_loss 16.435, KL_loss: 494340936623112.875, 
	
7000/191900 (epoch 3) loss: 3.301, gen_loss: 12.282, Ret_loss 3.301, FS_loss 16.437, KL_loss: 492403252501298.000, 
	
7005/191900 (epoch 3) loss: 3.301, gen_loss: 12.284, Ret_loss 3.301, FS_loss 16.439, KL_loss: 490432650641127.375, 
	
7010/191900 (epoch 3) loss: 3.301, gen_loss: 12.284, Ret_loss 3.301, FS_loss 16.440, KL_loss: 488478054670056.500, 
	
7015/191900 (epoch 3) loss: 3.300, gen_loss: 12.286, Ret_loss 3.300, FS_loss 16.443, KL_loss: 486550261288880.062, 
	
7020/191900 (epoch 3) loss: 3.300, gen_loss: 12.287, Ret_loss 3.300, FS_loss 16.445, KL_loss: 485029113022066.812, 
	
7025/191900 (epoch 3) loss: 3.300, gen_loss: 12.287, Ret_loss 3.300, FS_loss 16.446, KL_loss: 483118169429951.250, 
	
7030/191900 (epoch 3) loss: 3.299, gen_loss: 12.287, Ret_loss 3.299, FS_loss 16.447, KL_loss: 481222359815023.125, 
	
7035/191900 (epoch 3) loss: 3.299, gen_loss: 12.288, Ret_loss 3.299, FS_loss 16.449, KL_loss: 479351356252817.938, 
	
7040/191900 (epoch 3) loss: 3.299, gen_loss: 12.289, Ret_loss 3.299, FS_loss 16.451, KL_loss: 477485020895396.062, 
	
7045/191900 (epoch 3) loss: 3.299, gen_loss: 12.291, Ret_loss 3.299, FS_loss 16.453, KL_loss: 475633026737100.188, 
	
7050/191900 (epoch 3) loss: 3.298, gen_loss: 12.292, Ret_loss 3.298, FS_loss 16.454, KL_loss: 473796128863239.688, 
	
7055/191900 (epoch 3) loss: 3.298, gen_loss: 12.293, Ret_loss 3.298, FS_loss 16.455, KL_loss: 472007949189939.625, 
	
7060/191900 (epoch 3) loss: 3.297, gen_loss: 12.293, Ret_loss 3.297, FS_loss 16.455, KL_loss: 470198272452887.375, 
	
7065/191900 (epoch 3) loss: 3.297, gen_loss: 12.295, Ret_loss 3.297, FS_loss 16.457, KL_loss: 468402443487148.875, 
	
7070/191900 (epoch 3) loss: 3.297, gen_loss: 12.297, Ret_loss 3.297, FS_loss 16.460, KL_loss: 466621627370653.250, 
	
7075/191900 (epoch 3) loss: 3.297, gen_loss: 12.299, Ret_loss 3.297, FS_loss 16.462, KL_loss: 464929478601071.812, 
	
7080/191900 (epoch 3) loss: 3.296, gen_loss: 12.300, Ret_loss 3.296, FS_loss 16.464, KL_loss: 463174507387535.688, 
	
7085/191900 (epoch 3) loss: 3.296, gen_loss: 12.301, Ret_loss 3.296, FS_loss 16.465, KL_loss: 461432488346740.125, 
	
7090/191900 (epoch 3) loss: 3.296, gen_loss: 12.301, Ret_loss 3.296, FS_loss 16.466, KL_loss: 459704756321216.875, 
	
7095/191900 (epoch 3) loss: 3.295, gen_loss: 12.302, Ret_loss 3.295, FS_loss 16.467, KL_loss: 459633157142685.375, 
	
7100/191900 (epoch 3) loss: 3.295, gen_loss: 12.303, Ret_loss 3.295, FS_loss 16.467, KL_loss: 457927435525381.875, 
	
7105/191900 (epoch 3) loss: 3.295, gen_loss: 12.303, Ret_loss 3.295, FS_loss 16.468, KL_loss: 456233060420699.688, 
	
7110/191900 (epoch 3) loss: 3.294, gen_loss: 12.304, Ret_loss 3.294, FS_loss 16.470, KL_loss: 454552900019149.875, 
	
7115/191900 (epoch 3) loss: 3.294, gen_loss: 12.305, Ret_loss 3.294, FS_loss 16.471, KL_loss: 452888391159804.812, 
	
7120/191900 (epoch 3) loss: 3.293, gen_loss: 12.306, Ret_loss 3.293, FS_loss 16.472, KL_loss: 451232763994826.500, 
	
7125/191900 (epoch 3) loss: 3.293, gen_loss: 12.309, Ret_loss 3.293, FS_loss 16.476, KL_loss: 449595278292472.688, 
	
7130/191900 (epoch 3) loss: 3.293, gen_loss: 12.309, Ret_loss 3.293, FS_loss 16.476, KL_loss: 448012907940874.250, 
	
7135/191900 (epoch 3) loss: 3.292, gen_loss: 12.311, Ret_loss 3.292, FS_loss 16.479, KL_loss: 446388934401156.750, 
	
7140/191900 (epoch 3) loss: 3.292, gen_loss: 12.313, Ret_loss 3.292, FS_loss 16.482, KL_loss: 444776992775440.062, 
	
7145/191900 (epoch 3) loss: 3.292, gen_loss: 12.315, Ret_loss 3.292, FS_loss 16.484, KL_loss: 443179416350740.438, 
	
7150/191900 (epoch 3) loss: 3.291, gen_loss: 12.317, Ret_loss 3.291, FS_loss 16.487, KL_loss: 441611182506436.312, 
	
7155/191900 (epoch 3) loss: 3.290, gen_loss: 12.317, Ret_loss 3.290, FS_loss 16.488, KL_loss: 453093789492277.250, 
	
7160/191900 (epoch 3) loss: 3.290, gen_loss: 12.320, Ret_loss 3.290, FS_loss 16.491, KL_loss: 451481266666055.312, 
	
7165/191900 (epoch 3) loss: 3.290, gen_loss: 12.321, Ret_loss 3.290, FS_loss 16.493, KL_loss: 449881120903542.812, 
	
7170/191900 (epoch 3) loss: 3.289, gen_loss: 12.322, Ret_loss 3.289, FS_loss 16.495, KL_loss: 448587734627833.312, 
	
7175/191900 (epoch 3) loss: 3.289, gen_loss: 12.323, Ret_loss 3.289, FS_loss 16.496, KL_loss: 447132615915414.438, 
	
7180/191900 (epoch 3) loss: 3.289, gen_loss: 12.325, Ret_loss 3.289, FS_loss 16.497, KL_loss: 445565076041204.312, 
	
7185/191900 (epoch 3) loss: 3.289, gen_loss: 12.326, Ret_loss 3.289, FS_loss 16.498, KL_loss: 444007583574134.750, 
	
7190/191900 (epoch 3) loss: 3.288, gen_loss: 12.327, Ret_loss 3.288, FS_loss 16.500, KL_loss: 442461804955182.250, 
	
7195/191900 (epoch 3) loss: 3.288, gen_loss: 12.329, Ret_loss 3.288, FS_loss 16.502, KL_loss: 440929462124481.188, 
	
7200/191900 (epoch 3) loss: 3.287, gen_loss: 12.330, Ret_loss 3.287, FS_loss 16.505, KL_loss: 439405954837523.688, 
	
7205/191900 (epoch 3) loss: 3.287, gen_loss: 12.331, Ret_loss 3.287, FS_loss 16.506, KL_loss: 437892628369715.938, 
	
7210/191900 (epoch 3) loss: 3.286, gen_loss: 12.332, Ret_loss 3.286, FS_loss 16.507, KL_loss: 436563966150731.875, 
	
7215/191900 (epoch 3) loss: 3.286, gen_loss: 12.333, Ret_loss 3.286, FS_loss 16.509, KL_loss: 435069909062555.438, 
	
7220/191900 (epoch 3) loss: 3.286, gen_loss: 12.335, Ret_loss 3.286, FS_loss 16.512, KL_loss: 433584380041820.125, 
	
7225/191900 (epoch 3) loss: 3.286, gen_loss: 12.337, Ret_loss 3.286, FS_loss 16.513, KL_loss: 432109188219247.875, 
	
7230/191900 (epoch 3) loss: 3.286, gen_loss: 12.339, Ret_loss 3.286, FS_loss 16.515, KL_loss: 430648397306080.938, 
	
7235/191900 (epoch 3) loss: 3.286, gen_loss: 12.340, Ret_loss 3.286, FS_loss 16.517, KL_loss: 429265290214914.250, 
	
7240/191900 (epoch 3) loss: 3.286, gen_loss: 12.341, Ret_loss 3.286, FS_loss 16.518, KL_loss: 427819802134743.125, 
	
7245/191900 (epoch 3) loss: 3.285, gen_loss: 12.344, Ret_loss 3.285, FS_loss 16.522, KL_loss: 426386058774427.438, 
	
7250/191900 (epoch 3) loss: 3.286, gen_loss: 12.345, Ret_loss 3.286, FS_loss 16.524, KL_loss: 424974762958102.125, 
	
7255/191900 (epoch 3) loss: 3.285, gen_loss: 12.346, Ret_loss 3.285, FS_loss 16.525, KL_loss: 423557798270089.125, 
	
7260/191900 (epoch 3) loss: 3.285, gen_loss: 12.347, Ret_loss 3.285, FS_loss 16.526, KL_loss: 422153193693565.125, 
	
7265/191900 (epoch 3) loss: 3.285, gen_loss: 12.349, Ret_loss 3.285, FS_loss 16.528, KL_loss: 427970052332319.062, 
	
7270/191900 (epoch 3) loss: 3.284, gen_loss: 12.351, Ret_loss 3.284, FS_loss 16.530, KL_loss: 426556681129904.875, 
	
7275/191900 (epoch 3) loss: 3.284, gen_loss: 12.351, Ret_loss 3.284, FS_loss 16.531, KL_loss: 425152618500350.125, 
	
7280/191900 (epoch 3) loss: 3.285, gen_loss: 12.352, Ret_loss 3.285, FS_loss 16.532, KL_loss: 423761500093280.062, 
	
7285/191900 (epoch 3) loss: 3.284, gen_loss: 12.354, Ret_loss 3.284, FS_loss 16.535, KL_loss: 422375778333951.500, 
	
7290/191900 (epoch 3) loss: 3.284, gen_loss: 12.354, Ret_loss 3.284, FS_loss 16.536, KL_loss: 420999086409712.625, 
	
7295/191900 (epoch 3) loss: 3.283, gen_loss: 12.355, Ret_loss 3.283, FS_loss 16.537, KL_loss: 419633725391512.062, 
	
7300/191900 (epoch 3) loss: 3.283, gen_loss: 12.356, Ret_loss 3.283, FS_loss 16.538, KL_loss: 418275398425507.125, 
	
7305/191900 (epoch 3) loss: 3.282, gen_loss: 12.357, Ret_loss 3.282, FS_loss 16.540, KL_loss: 416925339647444.688, 
	
7310/191900 (epoch 3) loss: 3.282, gen_loss: 12.358, Ret_loss 3.282, FS_loss 16.541, KL_loss: 415584241893955.875, 
	
7315/191900 (epoch 3) loss: 3.281, gen_loss: 12.359, Ret_loss 3.281, FS_loss 16.543, KL_loss: 414260392349299.250, 
	
7320/191900 (epoch 3) loss: 3.282, gen_loss: 12.361, Ret_loss 3.282, FS_loss 16.545, KL_loss: 412936408144442.938, 
	
7325/191900 (epoch 3) loss: 3.281, gen_loss: 12.362, Ret_loss 3.281, FS_loss 16.547, KL_loss: 411621165940474.938, 
	
7330/191900 (epoch 3) loss: 3.281, gen_loss: 12.363, Ret_loss 3.281, FS_loss 16.548, KL_loss: 410361294682307.188, 
	
7335/191900 (epoch 3) loss: 3.281, gen_loss: 12.364, Ret_loss 3.281, FS_loss 16.550, KL_loss: 409125153114678.812, 
	
7340/191900 (epoch 3) loss: 3.281, gen_loss: 12.365, Ret_loss 3.281, FS_loss 16.551, KL_loss: 407838246810613.688, 
	
7345/191900 (epoch 3) loss: 3.280, gen_loss: 12.365, Ret_loss 3.280, FS_loss 16.552, KL_loss: 406557451166268.250, 
	
7350/191900 (epoch 3) loss: 3.279, gen_loss: 12.366, Ret_loss 3.279, FS_loss 16.552, KL_loss: 405283639537915.812, 
	
7355/191900 (epoch 3) loss: 3.279, gen_loss: 12.366, Ret_loss 3.279, FS_loss 16.554, KL_loss: 404022355435443.125, 
	
7360/191900 (epoch 3) loss: 3.279, gen_loss: 12.368, Ret_loss 3.279, FS_loss 16.556, KL_loss: 403207733227652.812, 
	
7365/191900 (epoch 3) loss: 3.279, gen_loss: 12.369, Ret_loss 3.279, FS_loss 16.558, KL_loss: 401955175059366.875, 
	
7370/191900 (epoch 3) loss: 3.279, gen_loss: 12.370, Ret_loss 3.279, FS_loss 16.561, KL_loss: 400710780537616.188, 
	
7375/191900 (epoch 3) loss: 3.279, gen_loss: 12.371, Ret_loss 3.279, FS_loss 16.563, KL_loss: 399552170761668.250, 
	
7380/191900 (epoch 3) loss: 3.278, gen_loss: 12.373, Ret_loss 3.278, FS_loss 16.566, KL_loss: 398326286075732.500, 
	
7385/191900 (epoch 3) loss: 3.277, gen_loss: 12.374, Ret_loss 3.277, FS_loss 16.569, KL_loss: 397104323414331.562, 
	
7390/191900 (epoch 3) loss: 3.277, gen_loss: 12.377, Ret_loss 3.277, FS_loss 16.572, KL_loss: 395919193778283.812, 
	
7395/191900 (epoch 3) loss: 3.276, gen_loss: 12.378, Ret_loss 3.276, FS_loss 16.574, KL_loss: 394713742304466.562, 
	
7400/191900 (epoch 3) loss: 3.276, gen_loss: 12.379, Ret_loss 3.276, FS_loss 16.577, KL_loss: 393514504006573.750, 
	
7405/191900 (epoch 3) loss: 3.276, gen_loss: 12.381, Ret_loss 3.276, FS_loss 16.580, KL_loss: 396497969701385.625, 
	
7410/191900 (epoch 3) loss: 3.276, gen_loss: 12.381, Ret_loss 3.276, FS_loss 16.581, KL_loss: 395300556660963.812, 
	
7415/191900 (epoch 3) loss: 3.275, gen_loss: 12.382, Ret_loss 3.275, FS_loss 16.583, KL_loss: 394110450315202.250, 
	
7420/191900 (epoch 3) loss: 3.275, gen_loss: 12.383, Ret_loss 3.275, FS_loss 16.585, KL_loss: 392940247712964.938, 
	
7425/191900 (epoch 3) loss: 3.275, gen_loss: 12.384, Ret_loss 3.275, FS_loss 16.586, KL_loss: 392145167459050.062, 
	
7430/191900 (epoch 3) loss: 3.275, gen_loss: 12.385, Ret_loss 3.275, FS_loss 16.589, KL_loss: 390974042705641.062, 
	
7435/191900 (epoch 3) loss: 3.275, gen_loss: 12.385, Ret_loss 3.275, FS_loss 16.589, KL_loss: 389809984504622.812, 
	
7440/191900 (epoch 3) loss: 3.275, gen_loss: 12.386, Ret_loss 3.275, FS_loss 16.591, KL_loss: 388684622991073.000, 
	
7445/191900 (epoch 3) loss: 3.274, gen_loss: 12.387, Ret_loss 3.274, FS_loss 16.593, KL_loss: 387603816878809.938, 
	
7450/191900 (epoch 3) loss: 3.274, gen_loss: 12.389, Ret_loss 3.274, FS_loss 16.595, KL_loss: 386481685068542.500, 
	
7455/191900 (epoch 3) loss: 3.273, gen_loss: 12.389, Ret_loss 3.273, FS_loss 16.596, KL_loss: 385344710121726.312, 
	
7460/191900 (epoch 3) loss: 3.273, gen_loss: 12.391, Ret_loss 3.273, FS_loss 16.598, KL_loss: 384215356663610.875, 
	
7465/191900 (epoch 3) loss: 3.273, gen_loss: 12.392, Ret_loss 3.273, FS_loss 16.600, KL_loss: 383111469479640.000, 
	
7470/191900 (epoch 3) loss: 3.272, gen_loss: 12.393, Ret_loss 3.272, FS_loss 16.602, KL_loss: 381994249261462.250, 
	
7475/191900 (epoch 3) loss: 3.272, gen_loss: 12.395, Ret_loss 3.272, FS_loss 16.604, KL_loss: 380883812900635.250, 
	
7480/191900 (epoch 3) loss: 3.271, gen_loss: 12.396, Ret_loss 3.271, FS_loss 16.606, KL_loss: 379805378493423.375, 
	
7485/191900 (epoch 3) loss: 3.271, gen_loss: 12.397, Ret_loss 3.271, FS_loss 16.608, KL_loss: 378708665278255.500, 
	
7490/191900 (epoch 3) loss: 3.271, gen_loss: 12.398, Ret_loss 3.271, FS_loss 16.611, KL_loss: 377618087590882.500, 
	
7495/191900 (epoch 3) loss: 3.270, gen_loss: 12.401, Ret_loss 3.270, FS_loss 16.614, KL_loss: 376534269918897.562, 
	
7500/191900 (epoch 3) loss: 3.270, gen_loss: 12.401, Ret_loss 3.270, FS_loss 16.615, KL_loss: 375457942029025.438, 
	
7505/191900 (epoch 3) loss: 3.269, gen_loss: 12.401, Ret_loss 3.269, FS_loss 16.616, KL_loss: 374391771350148.875, 
	
7510/191900 (epoch 3) loss: 3.269, gen_loss: 12.402, Ret_loss 3.269, FS_loss 16.618, KL_loss: 373335864581784.375, 
	
7515/191900 (epoch 3) loss: 3.269, gen_loss: 12.403, Ret_loss 3.269, FS_loss 16.619, KL_loss: 372320730264793.125, 
	
7520/191900 (epoch 3) loss: 3.269, gen_loss: 12.404, Ret_loss 3.269, FS_loss 16.621, KL_loss: 371265958530333.625, 
	
7525/191900 (epoch 3) loss: 3.268, gen_loss: 12.405, Ret_loss 3.268, FS_loss 16.623, KL_loss: 370217386546830.688, 
	
7530/191900 (epoch 3) loss: 3.267, gen_loss: 12.406, Ret_loss 3.267, FS_loss 16.626, KL_loss: 369198796665247.625, 
	
7535/191900 (epoch 3) loss: 3.268, gen_loss: 12.408, Ret_loss 3.268, FS_loss 16.627, KL_loss: 368162482033254.750, 
	
7540/191900 (epoch 3) loss: 3.267, gen_loss: 12.409, Ret_loss 3.267, FS_loss 16.630, KL_loss: 367130825132452.188, 
	
7545/191900 (epoch 3) loss: 3.267, gen_loss: 12.410, Ret_loss 3.267, FS_loss 16.631, KL_loss: 366112209338608.375, 
	
7550/191900 (epoch 3) loss: 3.267, gen_loss: 12.411, Ret_loss 3.267, FS_loss 16.633, KL_loss: 365094013750563.125, 
	
7555/191900 (epoch 3) loss: 3.266, gen_loss: 12.413, Ret_loss 3.266, FS_loss 16.636, KL_loss: 364079689297095.812, 
	
7560/191900 (epoch 3) loss: 3.266, gen_loss: 12.414, Ret_loss 3.266, FS_loss 16.638, KL_loss: 363076059144407.688, 
	
7565/191900 (epoch 3) loss: 3.266, gen_loss: 12.415, Ret_loss 3.266, FS_loss 16.640, KL_loss: 362080353565440.688, 
	
7570/191900 (epoch 3) loss: 3.266, gen_loss: 12.415, Ret_loss 3.266, FS_loss 16.642, KL_loss: 361139640005359.938, 
	
7575/191900 (epoch 3) loss: 3.266, gen_loss: 12.416, Ret_loss 3.266, FS_loss 16.644, KL_loss: 360147983664272.688, 
	
7580/191900 (epoch 3) loss: 3.265, gen_loss: 12.417, Ret_loss 3.265, FS_loss 16.647, KL_loss: 359161585809046.438, 
	
7585/191900 (epoch 3) loss: 3.265, gen_loss: 12.418, Ret_loss 3.265, FS_loss 16.649, KL_loss: 358186787320040.875, 
	
7590/191900 (epoch 3) loss: 3.265, gen_loss: 12.419, Ret_loss 3.265, FS_loss 16.650, KL_loss: 357270433485150.625, 
	
7595/191900 (epoch 3) loss: 3.265, gen_loss: 12.420, Ret_loss 3.265, FS_loss 16.652, KL_loss: 356306468974828.062, 
	
7600/191900 (epoch 3) loss: 3.264, gen_loss: 12.421, Ret_loss 3.264, FS_loss 16.654, KL_loss: 355342999563548.312, 
	
7605/191900 (epoch 3) loss: 3.264, gen_loss: 12.423, Ret_loss 3.264, FS_loss 16.658, KL_loss: 354384722665394.438, 
	
7610/191900 (epoch 3) loss: 3.263, gen_loss: 12.424, Ret_loss 3.263, FS_loss 16.660, KL_loss: 353543087184707.125, 
	
7615/191900 (epoch 3) loss: 3.264, gen_loss: 12.425, Ret_loss 3.264, FS_loss 16.662, KL_loss: 352664191889800.188, 
	
7620/191900 (epoch 3) loss: 3.263, gen_loss: 12.426, Ret_loss 3.263, FS_loss 16.665, KL_loss: 351718879390651.875, 
	
7625/191900 (epoch 3) loss: 3.263, gen_loss: 12.427, Ret_loss 3.263, FS_loss 16.667, KL_loss: 350778609643958.312, 
	
7630/191900 (epoch 3) loss: 3.263, gen_loss: 12.428, Ret_loss 3.263, FS_loss 16.670, KL_loss: 349849053953066.625, 
	
7635/191900 (epoch 3) loss: 3.262, gen_loss: 12.429, Ret_loss 3.262, FS_loss 16.672, KL_loss: 349012276008525.125, 
	
7640/191900 (epoch 3) loss: 3.262, gen_loss: 12.429, Ret_loss 3.262, FS_loss 16.674, KL_loss: 348087323717777.688, 
	
7645/191900 (epoch 3) loss: 3.262, gen_loss: 12.430, Ret_loss 3.262, FS_loss 16.676, KL_loss: 347169202239417.500, 
	
7650/191900 (epoch 3) loss: 3.262, gen_loss: 12.430, Ret_loss 3.262, FS_loss 16.677, KL_loss: 346478435865131.812, 
	
7655/191900 (epoch 3) loss: 3.262, gen_loss: 12.431, Ret_loss 3.262, FS_loss 16.679, KL_loss: 345566428564938.875, 
	
7660/191900 (epoch 3) loss: 3.262, gen_loss: 12.433, Ret_loss 3.262, FS_loss 16.682, KL_loss: 344659954318970.625, 
	
7665/191900 (epoch 3) loss: 3.261, gen_loss: 12.433, Ret_loss 3.261, FS_loss 16.682, KL_loss: 344038917528595.875, 
	
7670/191900 (epoch 3) loss: 3.261, gen_loss: 12.434, Ret_loss 3.261, FS_loss 16.684, KL_loss: 343140247295073.375, 
	
7675/191900 (epoch 3) loss: 3.261, gen_loss: 12.436, Ret_loss 3.261, FS_loss 16.687, KL_loss: 342246380291986.062, 
	
7680/191900 (epoch 4) loss: 3.118, gen_loss: 12.941, Ret_loss 3.118, FS_loss 17.795, KL_loss: 39644641204633.602, 
	
7685/191900 (epoch 4) loss: 3.171, gen_loss: 12.864, Ret_loss 3.171, FS_loss 17.617, KL_loss: 21388352552960.000, 
	
7690/191900 (epoch 4) loss: 3.124, gen_loss: 12.929, Ret_loss 3.124, FS_loss 17.671, KL_loss: 14926381012309.334, 
	
7695/191900 (epoch 4) loss: 3.089, gen_loss: 12.948, Ret_loss 3.089, FS_loss 17.722, KL_loss: 21503404221235.199, 
	
7700/191900 (epoch 4) loss: 3.078, gen_loss: 12.874, Ret_loss 3.078, FS_loss 17.607, KL_loss: 17206696494612.480, 
	
7705/191900 (epoch 4) loss: 3.072, gen_loss: 12.829, Ret_loss 3.072, FS_loss 17.556, KL_loss: 14341694155980.801, 
	
7710/191900 (epoch 4) loss: 3.064, gen_loss: 12.881, Ret_loss 3.064, FS_loss 17.626, KL_loss: 13052906858671.543, 
	
7715/191900 (epoch 4) loss: 3.063, gen_loss: 12.901, Ret_loss 3.063, FS_loss 17.649, KL_loss: 11466409663180.801, 
	
7720/191900 (epoch 4) loss: 3.061, gen_loss: 12.906, Ret_loss 3.061, FS_loss 17.647, KL_loss: 10199110861164.090, 
	
7725/191900 (epoch 4) loss: 3.074, gen_loss: 12.899, Ret_loss 3.074, FS_loss 17.627, KL_loss: 9287612595732.480, 
	
7730/191900 (epoch 4) loss: 3.082, gen_loss: 12.897, Ret_loss 3.082, FS_loss 17.616, KL_loss: 8779314140550.981, 
	
7735/191900 (epoch 4) loss: 3.090, gen_loss: 12.899, Ret_loss 3.090, FS_loss 17.620, KL_loss: 8061196030634.667, 
	
7740/191900 (epoch 4) loss: 3.097, gen_loss: 12.888, Ret_loss 3.097, FS_loss 17.621, KL_loss: 7502319831890.708, 
	
7745/191900 (epoch 4) loss: 3.108, gen_loss: 12.886, Ret_loss 3.108, FS_loss 17.619, KL_loss: 10490230884293.486, 
	
7750/191900 (epoch 4) loss: 3.102, gen_loss: 12.890, Ret_loss 3.102, FS_loss 17.633, KL_loss: 9801134555463.680, 
	
7755/191900 (epoch 4) loss: 3.110, gen_loss: 12.880, Ret_loss 3.110, FS_loss 17.624, KL_loss: 9224578979532.801, 
	
7760/191900 (epoch 4) loss: 3.112, gen_loss: 12.876, Ret_loss 3.112, FS_loss 17.633, KL_loss: 17055128808267.295, 
	
7765/191900 (epoch 4) loss: 3.117, gen_loss: 12.867, Ret_loss 3.117, FS_loss 17.622, KL_loss: 16136327680364.090, 
	
7770/191900 (epoch 4) loss: 3.116, gen_loss: 12.867, Ret_loss 3.116, FS_loss 17.633, KL_loss: 15362772210483.199, 
	
7775/191900 (epoch 4) loss: 3.114, gen_loss: 12.854, Ret_loss 3.114, FS_loss 17.626, KL_loss: 14901892967055.359, 
	
7780/191900 (epoch 4) loss: 3.118, gen_loss: 12.845, Ret_loss 3.118, FS_loss 17.616, KL_loss: 14206626316990.172, 
	
7785/191900 (epoch 4) loss: 3.119, gen_loss: 12.848, Ret_loss 3.119, FS_loss 17.623, KL_loss: 13572103191756.801, 
	
7790/191900 (epoch 4) loss: 3.119, gen_loss: 12.859, Ret_loss 3.119, FS_loss 17.646, KL_loss: 18932378015370.016, 
	
7795/191900 (epoch 4) loss: 3.122, gen_loss: 12.855, Ret_loss 3.122, FS_loss 17.641, KL_loss: 18145165252727.465, 
	
7800/191900 (epoch 4) loss: 3.125, gen_loss: 12.858, Ret_loss 3.125, FS_loss 17.647, KL_loss: 17419926745563.137, 
	
7805/191900 (epoch 4) loss: 3.130, gen_loss: 12.860, Ret_loss 3.130, FS_loss 17.650, KL_loss: 16910255223335.385, 
	
7810/191900 (epoch 4) loss: 3.130, gen_loss: 12.859, Ret_loss 3.130, FS_loss 17.651, KL_loss: 16297005809588.148, 
	
7815/191900 (epoch 4) loss: 3.134, gen_loss: 12.844, Ret_loss 3.134, FS_loss 17.636, KL_loss: 15717174550659.656, 
	
7820/191900 (epoch 4) loss: 3.132, gen_loss: 12.838, Ret_loss 3.132, FS_loss 17.627, KL_loss: 15184803856680.607, 
	
7825/191900 (epoch 4) loss: 3.136, gen_loss: 12.845, Ret_loss 3.136, FS_loss 17.634, KL_loss: 18249554912938.668, 
	
7830/191900 (epoch 4) loss: 3.136, gen_loss: 12.849, Ret_loss 3.136, FS_loss 17.638, KL_loss: 17666295773184.000, 
	
7835/191900 (epoch 4) loss: 3.141, gen_loss: 12.846, Ret_loss 3.141, FS_loss 17.639, KL_loss: 17125786222860.801, 
	
7840/191900 (epoch 4) loss: 3.141, gen_loss: 12.855, Ret_loss 3.141, FS_loss 17.653, KL_loss: 18329651126085.816, 
	
7845/191900 (epoch 4) loss: 3.137, gen_loss: 12.858, Ret_loss 3.137, FS_loss 17.657, KL_loss: 17793354888601.602, 
	
7850/191900 (epoch 4) loss: 3.136, gen_loss: 12.859, Ret_loss 3.136, FS_loss 17.661, KL_loss: 17288512267726.264, 
	
7855/191900 (epoch 4) loss: 3.135, gen_loss: 12.850, Ret_loss 3.135, FS_loss 17.651, KL_loss: 17405018193954.133, 
	
7860/191900 (epoch 4) loss: 3.132, gen_loss: 12.855, Ret_loss 3.132, FS_loss 17.656, KL_loss: 17296178105759.135, 
	
7865/191900 (epoch 4) loss: 3.130, gen_loss: 12.862, Ret_loss 3.130, FS_loss 17.666, KL_loss: 16843543978059.453, 
	
7870/191900 (epoch 4) loss: 3.128, gen_loss: 12.867, Ret_loss 3.128, FS_loss 17.671, KL_loss: 16424474813623.795, 
	
7875/191900 (epoch 4) loss: 3.126, gen_loss: 12.869, Ret_loss 3.126, FS_loss 17.676, KL_loss: 200901435103730.406, 
	
7880/191900 (epoch 4) loss: 3.127, gen_loss: 12.869, Ret_loss 3.127, FS_loss 17.683, KL_loss: 196001407621181.969, 
	
7885/191900 (epoch 4) loss: 3.128, gen_loss: 12.873, Ret_loss 3.128, FS_loss 17.690, KL_loss: 191334775016215.469, 
	
7890/191900 (epoch 4) loss: 3.127, gen_loss: 12.878, Ret_loss 3.127, FS_loss 17.701, KL_loss: 186888875375281.719, 
	
7895/191900 (epoch 4) loss: 3.126, gen_loss: 12.880, Ret_loss 3.126, FS_loss 17.704, KL_loss: 182641428935111.844, 
	
7900/191900 (epoch 4) loss: 3.128, gen_loss: 12.874, Ret_loss 3.128, FS_loss 17.695, KL_loss: 178582854336215.906, 
	
7905/191900 (epoch 4) loss: 3.128, gen_loss: 12.873, Ret_loss 3.128, FS_loss 17.693, KL_loss: 174906267587868.656, 
	
7910/191900 (epoch 4) loss: 3.135, gen_loss: 12.873, Ret_loss 3.135, FS_loss 17.696, KL_loss: 171185027277993.656, 
	
7915/191900 (epoch 4) loss: 3.135, gen_loss: 12.873, Ret_loss 3.135, FS_loss 17.695, KL_loss: 167619142035076.000, 
	
7920/191900 (epoch 4) loss: 3.138, gen_loss: 12.877, Ret_loss 3.138, FS_loss 17.702, KL_loss: 164220093378806.344, 
	
7925/191900 (epoch 4) loss: 3.138, gen_loss: 12.873, Ret_loss 3.138, FS_loss 17.698, KL_loss: 160936552282279.688, 
	
7930/191900 (epoch 4) loss: 3.138, gen_loss: 12.875, Ret_loss 3.138, FS_loss 17.702, KL_loss: 157783685016864.875, 
	
7935/191900 (epoch 4) loss: 3.137, gen_loss: 12.876, Ret_loss 3.137, FS_loss 17.705, KL_loss: 154887980525902.531, 
	
7940/191900 (epoch 4) loss: 3.136, gen_loss: 12.875, Ret_loss 3.136, FS_loss 17.706, KL_loss: 151966990584159.406, 
	
7945/191900 (epoch 4) loss: 3.135, gen_loss: 12.876, Ret_loss 3.135, FS_loss 17.706, KL_loss: 149155436380360.781, 
	
7950/191900 (epoch 4) loss: 3.135, gen_loss: 12.874, Ret_loss 3.135, FS_loss 17.709, KL_loss: 147042762678439.344, 
	
7955/191900 (epoch 4) loss: 3.134, gen_loss: 12.871, Ret_loss 3.134, FS_loss 17.707, KL_loss: 144512745581498.281, 
	
7960/191900 (epoch 4) loss: 3.131, gen_loss: 12.866, Ret_loss 3.131, FS_loss 17.706, KL_loss: 141982237470522.156, 
	
7965/191900 (epoch 4) loss: 3.131, gen_loss: 12.870, Ret_loss 3.131, FS_loss 17.713, KL_loss: 139550873609621.844, 
	
7970/191900 (epoch 4) loss: 3.132, gen_loss: 12.873, Ret_loss 3.132, FS_loss 17.716, KL_loss: 137269402873359.406, 
	
7975/191900 (epoch 4) loss: 3.132, gen_loss: 12.876, Ret_loss 3.132, FS_loss 17.725, KL_loss: 135038219212571.094, 
	
7980/191900 (epoch 4) loss: 3.133, gen_loss: 12.876, Ret_loss 3.133, FS_loss 17.728, KL_loss: 132934515724398.578, 
	
7985/191900 (epoch 4) loss: 3.130, gen_loss: 12.882, Ret_loss 3.130, FS_loss 17.738, KL_loss: 130797116944268.188, 
	
7990/191900 (epoch 4) loss: 3.130, gen_loss: 12.882, Ret_loss 3.130, FS_loss 17.739, KL_loss: 128725086761899.281, 
	
7995/191900 (epoch 4) loss: 3.126, gen_loss: 12.887, Ret_loss 3.126, FS_loss 17.751, KL_loss: 126733642885289.406, 
	
8000/191900 (epoch 4) loss: 3.125, gen_loss: 12.887, Ret_loss 3.125, FS_loss 17.753, KL_loss: 124841747068773.422, 
	
8005/191900 (epoch 4) loss: 3.128, gen_loss: 12.888, Ret_loss 3.128, FS_loss 17.755, KL_loss: 122979815168971.047, 
	
8010/191900 (epoch 4) loss: 3.126, gen_loss: 12.888, Ret_loss 3.126, FS_loss 17.760, KL_loss: 121240384251802.938, 
	
8015/191900 (epoch 4) loss: 3.127, gen_loss: 12.888, Ret_loss 3.127, FS_loss 17.762, KL_loss: 119478961158423.906, 
	
8020/191900 (epoch 4) loss: 3.127, gen_loss: 12.887, Ret_loss 3.127, FS_loss 17.760, KL_loss: 118654772004540.297, 
	
8025/191900 (epoch 4) loss: 3.126, gen_loss: 12.889, Ret_loss 3.126, FS_loss 17.765, KL_loss: 116960051251299.297, 
	
8030/191900 (epoch 4) loss: 3.127, gen_loss: 12.891, Ret_loss 3.127, FS_loss 17.770, KL_loss: 115313147356595.375, 
	
8035/191900 (epoch 4) loss: 3.128, gen_loss: 12.890, Ret_loss 3.128, FS_loss 17.769, KL_loss: 113772084558057.062, 
	
8040/191900 (epoch 4) loss: 3.125, gen_loss: 12.890, Ret_loss 3.125, FS_loss 17.772, KL_loss: 112217938416350.859, 
	
8045/191900 (epoch 4) loss: 3.125, gen_loss: 12.890, Ret_loss 3.125, FS_loss 17.775, KL_loss: 110702582627095.344, 
	
8050/191900 (epoch 4) loss: 3.125, gen_loss: 12.891, Ret_loss 3.125, FS_loss 17.778, KL_loss: 109231821909770.062, 
	
8055/191900 (epoch 4) loss: 3.125, gen_loss: 12.888, Ret_loss 3.125, FS_loss 17.777, KL_loss: 107881719645070.656, 
	
8060/191900 (epoch 4) loss: 3.123, gen_loss: 12.887, Ret_loss 3.123, FS_loss 17.778, KL_loss: 106481239371515.172, 
	
8065/191900 (epoch 4) loss: 3.123, gen_loss: 12.887, Ret_loss 3.123, FS_loss 17.782, KL_loss: 105117253248598.484, 
	
8070/191900 (epoch 4) loss: 3.122, gen_loss: 12.886, Ret_loss 3.122, FS_loss 17.780, KL_loss: 103842488363619.641, 
	
8075/191900 (epoch 4) loss: 3.125, gen_loss: 12.888, Ret_loss 3.125, FS_loss 17.782, KL_loss: 102552299974230.875, 
	
8080/191900 (epoch 4) loss: 3.124, gen_loss: 12.892, Ret_loss 3.124, FS_loss 17.785, KL_loss: 101289901384251.266, 
	
8085/191900 (epoch 4) loss: 3.124, gen_loss: 12.895, Ret_loss 3.124, FS_loss 17.788, KL_loss: 100062639513225.203, 
	
8090/191900 (epoch 4) loss: 3.125, gen_loss: 12.899, Ret_loss 3.125, FS_loss 17.791, KL_loss: 99684512172278.594, 
	
8095/191900 (epoch 4) loss: 3.125, gen_loss: 12.903, Ret_loss 3.125, FS_loss 17.795, KL_loss: 98498109251198.625, 
	
8100/191900 (epoch 4) loss: 3.126, gen_loss: 12.908, Ret_loss 3.126, FS_loss 17.799, KL_loss: 97339753656734.266, 
	
8105/191900 (epoch 4) loss: 3.124, gen_loss: 12.912, Ret_loss 3.124, FS_loss 17.806, KL_loss: 96265882524533.734, 
	
8110/191900 (epoch 4) loss: 3.124, gen_loss: 12.914, Ret_loss 3.124, FS_loss 17.807, KL_loss: 95160985775873.625, 
	
8115/191900 (epoch 4) loss: 3.123, gen_loss: 12.915, Ret_loss 3.123, FS_loss 17.808, KL_loss: 94080594137069.234, 
	
8120/191900 (epoch 4) loss: 3.122, gen_loss: 12.917, Ret_loss 3.122, FS_loss 17.811, KL_loss: 93060926104656.391, 
	
8125/191900 (epoch 4) loss: 3.123, gen_loss: 12.920, Ret_loss 3.123, FS_loss 17.814, KL_loss: 94665554985501.438, 
	
8130/191900 (epoch 4) loss: 3.124, gen_loss: 12.921, Ret_loss 3.124, FS_loss 17.814, KL_loss: 93625384023602.500, 
	
8135/191900 (epoch 4) loss: 3.123, gen_loss: 12.926, Ret_loss 3.123, FS_loss 17.818, KL_loss: 92608206194525.359, 
	
8140/191900 (epoch 4) loss: 3.122, gen_loss: 12.927, Ret_loss 3.122, FS_loss 17.820, KL_loss: 92023369996237.219, 
	
8145/191900 (epoch 4) loss: 3.125, gen_loss: 12.929, Ret_loss 3.125, FS_loss 17.820, KL_loss: 91047410493132.656, 
	
8150/191900 (epoch 4) loss: 3.125, gen_loss: 12.931, Ret_loss 3.125, FS_loss 17.822, KL_loss: 90100770212514.625, 
	
8155/191900 (epoch 4) loss: 3.126, gen_loss: 12.935, Ret_loss 3.126, FS_loss 17.826, KL_loss: 89393031414815.859, 
	
8160/191900 (epoch 4) loss: 3.124, gen_loss: 12.938, Ret_loss 3.124, FS_loss 17.825, KL_loss: 88472421188054.703, 
	
8165/191900 (epoch 4) loss: 3.124, gen_loss: 12.938, Ret_loss 3.124, FS_loss 17.823, KL_loss: 87570976257686.328, 
	
8170/191900 (epoch 4) loss: 3.123, gen_loss: 12.939, Ret_loss 3.123, FS_loss 17.824, KL_loss: 90277821123827.969, 
	
8175/191900 (epoch 4) loss: 3.123, gen_loss: 12.939, Ret_loss 3.123, FS_loss 17.826, KL_loss: 89375115177350.531, 
	
8180/191900 (epoch 4) loss: 3.122, gen_loss: 12.942, Ret_loss 3.122, FS_loss 17.829, KL_loss: 88490277612765.406, 
	
8185/191900 (epoch 4) loss: 3.122, gen_loss: 12.945, Ret_loss 3.122, FS_loss 17.832, KL_loss: 87627488977181.484, 
	
8190/191900 (epoch 4) loss: 3.122, gen_loss: 12.946, Ret_loss 3.122, FS_loss 17.835, KL_loss: 86777288839832.484, 
	
8195/191900 (epoch 4) loss: 3.123, gen_loss: 12.949, Ret_loss 3.123, FS_loss 17.837, KL_loss: 85943178909141.047, 
	
8200/191900 (epoch 4) loss: 3.122, gen_loss: 12.951, Ret_loss 3.122, FS_loss 17.840, KL_loss: 85180264900787.812, 
	
8205/191900 (epoch 4) loss: 3.123, gen_loss: 12.951, Ret_loss 3.123, FS_loss 17.839, KL_loss: 84381328898964.172, 
	
8210/191900 (epoch 4) loss: 3.122, gen_loss: 12.955, Ret_loss 3.122, FS_loss 17.843, KL_loss: 83594110223128.766, 
	
8215/191900 (epoch 4) loss: 3.121, gen_loss: 12.954, Ret_loss 3.121, FS_loss 17.843, KL_loss: 82835685423934.938, 
	
8220/191900 (epoch 4) loss: 3.120, gen_loss: 12.957, Ret_loss 3.120, FS_loss 17.847, KL_loss: 82309378539696.969, 
	
8225/191900 (epoch 4) loss: 3.119, gen_loss: 12.958, Ret_loss 3.119, FS_loss 17.847, KL_loss: 81562741307113.078, 
	
8230/191900 (epoch 4) loss: 3.119, gen_loss: 12.962, Ret_loss 3.119, FS_loss 17.852, KL_loss: 80830391406035.141, 
	
8235/191900 (epoch 4) loss: 3.120, gen_loss: 12.964, Ret_loss 3.120, FS_loss 17.854, KL_loss: 80226805236147.547, 
	
8240/191900 (epoch 4) loss: 3.120, gen_loss: 12.967, Ret_loss 3.120, FS_loss 17.858, KL_loss: 79518916651363.562, 
	
8245/191900 (epoch 4) loss: 3.120, gen_loss: 12.969, Ret_loss 3.120, FS_loss 17.860, KL_loss: 78822609039112.422, 
	
8250/191900 (epoch 4) loss: 3.119, gen_loss: 12.969, Ret_loss 3.119, FS_loss 17.858, KL_loss: 146524470959170.219, 
	
8255/191900 (epoch 4) loss: 3.118, gen_loss: 12.971, Ret_loss 3.118, FS_loss 17.860, KL_loss: 145275324169248.125, 
	
8260/191900 (epoch 4) loss: 3.119, gen_loss: 12.973, Ret_loss 3.119, FS_loss 17.861, KL_loss: 144036294885428.844, 
	
8265/191900 (epoch 4) loss: 3.117, gen_loss: 12.974, Ret_loss 3.117, FS_loss 17.862, KL_loss: 143021490229703.062, 
	
8270/191900 (epoch 4) loss: 3.117, gen_loss: 12.977, Ret_loss 3.117, FS_loss 17.863, KL_loss: 141848693099776.750, 
	
8275/191900 (epoch 4) loss: 3.118, gen_loss: 12.978, Ret_loss 3.118, FS_loss 17.864, KL_loss: 140677177679268.156, 
	
8280/191900 (epoch 4) loss: 3.119, gen_loss: 12.981, Ret_loss 3.119, FS_loss 17.868, KL_loss: 139524389437545.250, 
	
8285/191900 (epoch 4) loss: 3.119, gen_loss: 12.983, Ret_loss 3.119, FS_loss 17.870, KL_loss: 138401600271796.781, 
	
8290/191900 (epoch 4) loss: 3.118, gen_loss: 12.986, Ret_loss 3.118, FS_loss 17.872, KL_loss: 138011251836209.016, 
	
8295/191900 (epoch 4) loss: 3.118, gen_loss: 12.988, Ret_loss 3.118, FS_loss 17.872, KL_loss: 137394754901269.781, 
	
8300/191900 (epoch 4) loss: 3.118, gen_loss: 12.991, Ret_loss 3.118, FS_loss 17.875, KL_loss: 136295692207132.156, 
	
8305/191900 (epoch 4) loss: 3.118, gen_loss: 12.991, Ret_loss 3.118, FS_loss 17.873, KL_loss: 135214294034759.016, 
	
8310/191900 (epoch 4) loss: 3.118, gen_loss: 12.992, Ret_loss 3.118, FS_loss 17.873, KL_loss: 134160167233625.000, 
	
8315/191900 (epoch 4) loss: 3.118, gen_loss: 12.993, Ret_loss 3.118, FS_loss 17.873, KL_loss: 133112523675157.094, 
	
8320/191900 (epoch 4) loss: 3.119, gen_loss: 12.993, Ret_loss 3.119, FS_loss 17.874, KL_loss: 132081850297315.719, 
	
8325/191900 (epoch 4) loss: 3.119, gen_loss: 12.994, Ret_loss 3.119, FS_loss 17.874, KL_loss: 131110095865177.297, 
	
8330/191900 (epoch 4) loss: 3.118, gen_loss: 12.994, Ret_loss 3.118, FS_loss 17.873, KL_loss: 130111562176629.547, 
	
8335/191900 (epoch 4) loss: 3.119, gen_loss: 12.996, Ret_loss 3.119, FS_loss 17.875, KL_loss: 129128568901863.469, 
	
8340/191900 (epoch 4) loss: 3.119, gen_loss: 12.999, Ret_loss 3.119, FS_loss 17.877, KL_loss: 128220705710543.781, 
	
8345/191900 (epoch 4) loss: 3.119, gen_loss: 13.000, Ret_loss 3.119, FS_loss 17.877, KL_loss: 127272102230751.422, 
	
8350/191900 (epoch 4) loss: 3.119, gen_loss: 13.002, Ret_loss 3.119, FS_loss 17.878, KL_loss: 126334442795665.156, 
	
8355/191900 (epoch 4) loss: 3.119, gen_loss: 13.005, Ret_loss 3.119, FS_loss 17.880, KL_loss: 125433390240908.328, 
	
8360/191900 (epoch 4) loss: 3.117, gen_loss: 13.006, Ret_loss 3.117, FS_loss 17.882, KL_loss: 125263987967586.203, 
	
8365/191900 (epoch 4) loss: 3.116, gen_loss: 13.008, Ret_loss 3.116, FS_loss 17.882, KL_loss: 124410214090468.828, 
	
8370/191900 (epoch 4) loss: 3.115, gen_loss: 13.010, Ret_loss 3.115, FS_loss 17.884, KL_loss: 123558358397660.547, 
	
8375/191900 (epoch 4) loss: 3.115, gen_loss: 13.011, Ret_loss 3.115, FS_loss 17.884, KL_loss: 122693972878630.312, 
	
8380/191900 (epoch 4) loss: 3.114, gen_loss: 13.011, Ret_loss 3.114, FS_loss 17.883, KL_loss: 121907497212600.016, 
	
8385/191900 (epoch 4) loss: 3.113, gen_loss: 13.013, Ret_loss 3.113, FS_loss 17.887, KL_loss: 121059315303330.531, 
	
8390/191900 (epoch 4) loss: 3.113, gen_loss: 13.014, Ret_loss 3.113, FS_loss 17.887, KL_loss: 120299284486412.078, 
	
8395/191900 (epoch 4) loss: 3.112, gen_loss: 13.016, Ret_loss 3.112, FS_loss 17.889, KL_loss: 119464508852265.516, 
	
8400/191900 (epoch 4) loss: 3.112, gen_loss: 13.018, Ret_loss 3.112, FS_loss 17.890, KL_loss: 118648505729969.172, 
	
8405/191900 (epoch 4) loss: 3.112, gen_loss: 13.020, Ret_loss 3.112, FS_loss 17.892, KL_loss: 117902513587967.562, 
	
8410/191900 (epoch 4) loss: 3.113, gen_loss: 13.023, Ret_loss 3.113, FS_loss 17.894, KL_loss: 117101028409150.609, 
	
8415/191900 (epoch 4) loss: 3.113, gen_loss: 13.025, Ret_loss 3.113, FS_loss 17.897, KL_loss: 116532791375779.547, 
	
8420/191900 (epoch 4) loss: 3.113, gen_loss: 13.025, Ret_loss 3.113, FS_loss 17.896, KL_loss: 115753743118106.719, 
	
8425/191900 (epoch 4) loss: 3.112, gen_loss: 13.027, Ret_loss 3.112, FS_loss 17.897, KL_loss: 114983178232306.609, 
	
8430/191900 (epoch 4) loss: 3.111, gen_loss: 13.026, Ret_loss 3.111, FS_loss 17.897, KL_loss: 114265063449950.172, 
	
8435/191900 (epoch 4) loss: 3.111, gen_loss: 13.026, Ret_loss 3.111, FS_loss 17.898, KL_loss: 114389775277731.281, 
	
8440/191900 (epoch 4) loss: 3.111, gen_loss: 13.027, Ret_loss 3.111, FS_loss 17.898, KL_loss: 113648271603378.953, 
	
8445/191900 (epoch 4) loss: 3.111, gen_loss: 13.027, Ret_loss 3.111, FS_loss 17.898, KL_loss: 112916283952967.391, 
	
8450/191900 (epoch 4) loss: 3.109, gen_loss: 13.028, Ret_loss 3.109, FS_loss 17.899, KL_loss: 112251315620325.156, 
	
8455/191900 (epoch 4) loss: 3.109, gen_loss: 13.029, Ret_loss 3.109, FS_loss 17.901, KL_loss: 111532580567624.453, 
	
8460/191900 (epoch 4) loss: 3.108, gen_loss: 13.030, Ret_loss 3.108, FS_loss 17.901, KL_loss: 110823646363853.047, 
	
8465/191900 (epoch 4) loss: 3.108, gen_loss: 13.033, Ret_loss 3.108, FS_loss 17.905, KL_loss: 110382165726186.203, 
	
8470/191900 (epoch 4) loss: 3.108, gen_loss: 13.034, Ret_loss 3.108, FS_loss 17.906, KL_loss: 109689237790561.812, 
	
8475/191900 (epoch 4) loss: 3.108, gen_loss: 13.036, Ret_loss 3.108, FS_loss 17.908, KL_loss: 109008864666558.953, 
	
8480/191900 (epoch 4) loss: 3.108, gen_loss: 13.037, Ret_loss 3.108, FS_loss 17.909, KL_loss: 108475964101087.797, 
	
8485/191900 (epoch 4) loss: 3.108, gen_loss: 13.038, Ret_loss 3.108, FS_loss 17.911, KL_loss: 107815854276988.766, 
	
8490/191900 (epoch 4) loss: 3.108, gen_loss: 13.039, Ret_loss 3.108, FS_loss 17.911, KL_loss: 107251610452386.625, 
	
8495/191900 (epoch 4) loss: 3.108, gen_loss: 13.039, Ret_loss 3.108, FS_loss 17.910, KL_loss: 106601235422748.953, 
	
8500/191900 (epoch 4) loss: 3.108, gen_loss: 13.038, Ret_loss 3.108, FS_loss 17.909, KL_loss: 105958457147587.109, 
	
8505/191900 (epoch 4) loss: 3.108, gen_loss: 13.040, Ret_loss 3.108, FS_loss 17.911, KL_loss: 105370104438444.953, 
	
8510/191900 (epoch 4) loss: 3.107, gen_loss: 13.041, Ret_loss 3.107, FS_loss 17.912, KL_loss: 105576960925820.094, 
	
8515/191900 (epoch 4) loss: 3.107, gen_loss: 13.043, Ret_loss 3.107, FS_loss 17.915, KL_loss: 104948646011039.922, 
	
8520/191900 (epoch 4) loss: 3.106, gen_loss: 13.045, Ret_loss 3.106, FS_loss 17.917, KL_loss: 104327859989246.109, 
	
8525/191900 (epoch 4) loss: 3.105, gen_loss: 13.047, Ret_loss 3.105, FS_loss 17.919, KL_loss: 103748340490136.625, 
	
8530/191900 (epoch 4) loss: 3.106, gen_loss: 13.047, Ret_loss 3.106, FS_loss 17.920, KL_loss: 103142014157693.672, 
	
8535/191900 (epoch 4) loss: 3.104, gen_loss: 13.050, Ret_loss 3.104, FS_loss 17.922, KL_loss: 102557460881372.500, 
	
8540/191900 (epoch 4) loss: 3.105, gen_loss: 13.051, Ret_loss 3.105, FS_loss 17.925, KL_loss: 101981734990645.797, 
	
8545/191900 (epoch 4) loss: 3.104, gen_loss: 13.052, Ret_loss 3.104, FS_loss 17.925, KL_loss: 101397385167848.688, 
	
8550/191900 (epoch 4) loss: 3.105, gen_loss: 13.054, Ret_loss 3.105, FS_loss 17.926, KL_loss: 101162643581251.219, 
	
8555/191900 (epoch 4) loss: 3.104, gen_loss: 13.056, Ret_loss 3.104, FS_loss 17.928, KL_loss: 100588407385239.484, 
	
8560/191900 (epoch 4) loss: 3.104, gen_loss: 13.058, Ret_loss 3.104, FS_loss 17.931, KL_loss: 100022264990149.781, 
	
8565/191900 (epoch 4) loss: 3.104, gen_loss: 13.058, Ret_loss 3.104, FS_loss 17.931, KL_loss: 99487199073261.812, 
	
8570/191900 (epoch 4) loss: 3.104, gen_loss: 13.059, Ret_loss 3.104, FS_loss 17.931, KL_loss: 98934709573641.375, 
	
8575/191900 (epoch 4) loss: 3.104, gen_loss: 13.060, Ret_loss 3.104, FS_loss 17.933, KL_loss: 98430272170432.500, 
	
8580/191900 (epoch 4) loss: 3.104, gen_loss: 13.060, Ret_loss 3.104, FS_loss 17.932, KL_loss: 97887849509957.234, 
	
8585/191900 (epoch 4) loss: 3.104, gen_loss: 13.060, Ret_loss 3.104, FS_loss 17.932, KL_loss: 97358944393195.953, 
	
8590/191900 (epoch 4) loss: 3.103, gen_loss: 13.062, Ret_loss 3.103, FS_loss 17.933, KL_loss: 96853128760294.469, 
	
8595/191900 (epoch 4) loss: 3.103, gen_loss: 13.063, Ret_loss 3.103, FS_loss 17.935, KL_loss: 96327830799674.094, 
	
8600/191900 (epoch 4) loss: 3.103, gen_loss: 13.064, Ret_loss 3.103, FS_loss 17.937, KL_loss: 115339393101441.172, 
	
8605/191900 (epoch 4) loss: 3.103, gen_loss: 13.066, Ret_loss 3.103, FS_loss 17.940, KL_loss: 114719304007232.969, 
	
8610/191900 (epoch 4) loss: 3.103, gen_loss: 13.067, Ret_loss 3.103, FS_loss 17.941, KL_loss: 114105836983538.656, 
	
8615/191900 (epoch 4) loss: 3.102, gen_loss: 13.069, Ret_loss 3.102, FS_loss 17.943, KL_loss: 113499354925948.531, 
	
8620/191900 (epoch 4) loss: 3.102, gen_loss: 13.071, Ret_loss 3.102, FS_loss 17.946, KL_loss: 112898848464502.188, 
	
8625/191900 (epoch 4) loss: 3.102, gen_loss: 13.071, Ret_loss 3.102, FS_loss 17.947, KL_loss: 112304701000913.984, 
	
8630/191900 (epoch 4) loss: 3.102, gen_loss: 13.072, Ret_loss 3.102, FS_loss 17.949, KL_loss: 111717494973660.688, 
	
8635/191900 (epoch 4) loss: 3.102, gen_loss: 13.073, Ret_loss 3.102, FS_loss 17.951, KL_loss: 111135678936206.734, 
	
8640/191900 (epoch 4) loss: 3.102, gen_loss: 13.075, Ret_loss 3.102, FS_loss 17.954, KL_loss: 110565075911691.469, 
	
8645/191900 (epoch 4) loss: 3.102, gen_loss: 13.076, Ret_loss 3.102, FS_loss 17.955, KL_loss: 109995317028274.734, 
	
8650/191900 (epoch 4) loss: 3.102, gen_loss: 13.078, Ret_loss 3.102, FS_loss 17.957, KL_loss: 109431557996797.969, 
	
8655/191900 (epoch 4) loss: 3.101, gen_loss: 13.080, Ret_loss 3.101, FS_loss 17.960, KL_loss: 108891972941834.250, 
	
8660/191900 (epoch 4) loss: 3.101, gen_loss: 13.082, Ret_loss 3.101, FS_loss 17.964, KL_loss: 108339701614084.484, 
	
8665/191900 (epoch 4) loss: 3.100, gen_loss: 13.082, Ret_loss 3.100, FS_loss 17.966, KL_loss: 107797742342245.172, 
	
8670/191900 (epoch 4) loss: 3.100, gen_loss: 13.083, Ret_loss 3.100, FS_loss 17.967, KL_loss: 107472938231721.359, 
	
8675/191900 (epoch 4) loss: 3.100, gen_loss: 13.083, Ret_loss 3.100, FS_loss 17.969, KL_loss: 106938026714031.938, 
	
8680/191900 (epoch 4) loss: 3.101, gen_loss: 13.083, Ret_loss 3.101, FS_loss 17.970, KL_loss: 106772099781673.578, 
	
8685/191900 (epoch 4) loss: 3.100, gen_loss: 13.083, Ret_loss 3.100, FS_loss 17.972, KL_loss: 106243733879462.078, 
	
8690/191900 (epoch 4) loss: 3.099, gen_loss: 13.084, Ret_loss 3.099, FS_loss 17.975, KL_loss: 105720422448320.500, 
	
8695/191900 (epoch 4) loss: 3.099, gen_loss: 13.084, Ret_loss 3.099, FS_loss 17.976, KL_loss: 105502226028600.031, 
	
8700/191900 (epoch 4) loss: 3.099, gen_loss: 13.084, Ret_loss 3.099, FS_loss 17.978, KL_loss: 104988736559657.266, 
	
8705/191900 (epoch 4) loss: 3.099, gen_loss: 13.084, Ret_loss 3.099, FS_loss 17.981, KL_loss: 104479777777293.984, 
	
8710/191900 (epoch 4) loss: 3.098, gen_loss: 13.083, Ret_loss 3.098, FS_loss 17.981, KL_loss: 103993192163955.078, 
	
8715/191900 (epoch 4) loss: 3.097, gen_loss: 13.082, Ret_loss 3.097, FS_loss 17.982, KL_loss: 103495758030918.703, 
	
8720/191900 (epoch 4) loss: 3.097, gen_loss: 13.082, Ret_loss 3.097, FS_loss 17.984, KL_loss: 103002738678882.781, 
	
8725/191900 (epoch 4) loss: 3.096, gen_loss: 13.081, Ret_loss 3.096, FS_loss 17.986, KL_loss: 102699723829357.047, 
	
8730/191900 (epoch 4) loss: 3.096, gen_loss: 13.081, Ret_loss 3.096, FS_loss 17.988, KL_loss: 102213269730615.391, 
	
8735/191900 (epoch 4) loss: 3.095, gen_loss: 13.081, Ret_loss 3.095, FS_loss 17.990, KL_loss: 101731664182380.016, 
	
8740/191900 (epoch 4) loss: 3.096, gen_loss: 13.080, Ret_loss 3.096, FS_loss 17.991, KL_loss: 101274801906990.688, 
	
8745/191900 (epoch 4) loss: 3.095, gen_loss: 13.080, Ret_loss 3.095, FS_loss 17.992, KL_loss: 100802528749445.328, 
	
8750/191900 (epoch 4) loss: 3.095, gen_loss: 13.082, Ret_loss 3.095, FS_loss 17.996, KL_loss: 100969356113007.266, 
	
8755/191900 (epoch 4) loss: 3.095, gen_loss: 13.080, Ret_loss 3.095, FS_loss 17.997, KL_loss: 100504093404148.438, 
	
8760/191900 (epoch 4) loss: 3.095, gen_loss: 13.080, Ret_loss 3.095, FS_loss 17.998, KL_loss: 100042061258665.000, 
	
8765/191900 (epoch 4) loss: 3.094, gen_loss: 13.081, Ret_loss 3.094, FS_loss 18.002, KL_loss: 99658053988701.297, 
	
8770/191900 (epoch 4) loss: 3.094, gen_loss: 13.081, Ret_loss 3.094, FS_loss 18.004, KL_loss: 99203932937375.734, 
	
8775/191900 (epoch 4) loss: 3.094, gen_loss: 13.079, Ret_loss 3.094, FS_loss 18.005, KL_loss: 98755236208368.000, 
	
8780/191900 (epoch 4) loss: 3.094, gen_loss: 13.081, Ret_loss 3.094, FS_loss 18.009, KL_loss: 98347145989039.203, 
	
8785/191900 (epoch 4) loss: 3.093, gen_loss: 13.081, Ret_loss 3.093, FS_loss 18.010, KL_loss: 97904323813364.750, 
	
8790/191900 (epoch 4) loss: 3.093, gen_loss: 13.081, Ret_loss 3.093, FS_loss 18.013, KL_loss: 97466107836667.469, 
	
8795/191900 (epoch 4) loss: 3.092, gen_loss: 13.083, Ret_loss 3.092, FS_loss 18.018, KL_loss: 97068786885028.406, 
	
8800/191900 (epoch 4) loss: 3.092, gen_loss: 13.084, Ret_loss 3.092, FS_loss 18.020, KL_loss: 96638118173369.062, 
	
8805/191900 (epoch 4) loss: 3.091, gen_loss: 13.085, Ret_loss 3.091, FS_loss 18.023, KL_loss: 96211742987098.906, 
	
8810/191900 (epoch 4) loss: 3.092, gen_loss: 13.085, Ret_loss 3.092, FS_loss 18.025, KL_loss: 96299898534200.000, 
	
8815/191900 (epoch 4) loss: 3.091, gen_loss: 13.084, Ret_loss 3.091, FS_loss 18.024, KL_loss: 95878076213272.984, 
	
8820/191900 (epoch 4) loss: 3.091, gen_loss: 13.086, Ret_loss 3.091, FS_loss 18.028, KL_loss: 95459848435767.281, 
	
8825/191900 (epoch 4) loss: 3.091, gen_loss: 13.085, Ret_loss 3.091, FS_loss 18.028, KL_loss: 95071824585027.953, 
	
8830/191900 (epoch 4) loss: 3.091, gen_loss: 13.087, Ret_loss 3.091, FS_loss 18.031, KL_loss: 94662573130887.484, 
	
8835/191900 (epoch 4) loss: 3.090, gen_loss: 13.086, Ret_loss 3.090, FS_loss 18.032, KL_loss: 94261458955719.344, 
	
8840/191900 (epoch 4) loss: 3.090, gen_loss: 13.087, Ret_loss 3.090, FS_loss 18.035, KL_loss: 93899356920537.375, 
	
8845/191900 (epoch 4) loss: 3.089, gen_loss: 13.088, Ret_loss 3.089, FS_loss 18.037, KL_loss: 93499221488207.484, 
	
8850/191900 (epoch 4) loss: 3.088, gen_loss: 13.088, Ret_loss 3.088, FS_loss 18.039, KL_loss: 93104143100522.594, 
	
8855/191900 (epoch 4) loss: 3.089, gen_loss: 13.090, Ret_loss 3.089, FS_loss 18.042, KL_loss: 93108347117147.828, 
	
8860/191900 (epoch 4) loss: 3.088, gen_loss: 13.091, Ret_loss 3.088, FS_loss 18.043, KL_loss: 92715900304104.719, 
	
8865/191900 (epoch 4) loss: 3.089, gen_loss: 13.092, Ret_loss 3.089, FS_loss 18.045, KL_loss: 92329748016762.891, 
	
8870/191900 (epoch 4) loss: 3.088, gen_loss: 13.094, Ret_loss 3.088, FS_loss 18.049, KL_loss: 91964302484137.938, 
	
8875/191900 (epoch 4) loss: 3.089, gen_loss: 13.096, Ret_loss 3.089, FS_loss 18.051, KL_loss: 91599047291484.000, 
	
8880/191900 (epoch 4) loss: 3.088, gen_loss: 13.096, Ret_loss 3.088, FS_loss 18.052, KL_loss: 91286527278291.438, 
	
8885/191900 (epoch 4) loss: 3.088, gen_loss: 13.099, Ret_loss 3.088, FS_loss 18.056, KL_loss: 90910130977884.938, 
	
8890/191900 (epoch 4) loss: 3.088, gen_loss: 13.099, Ret_loss 3.088, FS_loss 18.057, KL_loss: 92119532422040.172, 
	
8895/191900 (epoch 4) loss: 3.088, gen_loss: 13.100, Ret_loss 3.088, FS_loss 18.059, KL_loss: 91744078954042.594, 
	
8900/191900 (epoch 4) loss: 3.087, gen_loss: 13.102, Ret_loss 3.087, FS_loss 18.063, KL_loss: 91385498311095.531, 
	
8905/191900 (epoch 4) loss: 3.087, gen_loss: 13.104, Ret_loss 3.087, FS_loss 18.066, KL_loss: 91034088871882.562, 
	
8910/191900 (epoch 4) loss: 3.086, gen_loss: 13.105, Ret_loss 3.086, FS_loss 18.068, KL_loss: 90666719867914.625, 
	
8915/191900 (epoch 4) loss: 3.087, gen_loss: 13.106, Ret_loss 3.087, FS_loss 18.070, KL_loss: 90391899817247.219, 
	
8920/191900 (epoch 4) loss: 3.086, gen_loss: 13.107, Ret_loss 3.086, FS_loss 18.072, KL_loss: 90031266998444.562, 
	
8925/191900 (epoch 4) loss: 3.086, gen_loss: 13.109, Ret_loss 3.086, FS_loss 18.074, KL_loss: 89682697885676.188, 
	
8930/191900 (epoch 4) loss: 3.086, gen_loss: 13.109, Ret_loss 3.086, FS_loss 18.075, KL_loss: 1144121402546157.750, 
	
8935/191900 (epoch 4) loss: 3.085, gen_loss: 13.110, Ret_loss 3.085, FS_loss 18.077, KL_loss: 1139581936852839.000, 
	
8940/191900 (epoch 4) loss: 3.084, gen_loss: 13.110, Ret_loss 3.084, FS_loss 18.078, KL_loss: 1135093056374306.250, 
	
8945/191900 (epoch 4) loss: 3.084, gen_loss: 13.112, Ret_loss 3.084, FS_loss 18.080, KL_loss: 1130925926022022.750, 
	
8950/191900 (epoch 4) loss: 3.084, gen_loss: 13.112, Ret_loss 3.084, FS_loss 18.080, KL_loss: 1126572811202881.000, 
	
8955/191900 (epoch 4) loss: 3.084, gen_loss: 13.114, Ret_loss 3.084, FS_loss 18.083, KL_loss: 1122187932971279.750, 
	
8960/191900 (epoch 4) loss: 3.083, gen_loss: 13.115, Ret_loss 3.083, FS_loss 18.085, KL_loss: 1117822604575832.250, 
	
8965/191900 (epoch 4) loss: 3.083, gen_loss: 13.115, Ret_loss 3.083, FS_loss 18.086, KL_loss: 1113491954880445.125, 
	
8970/191900 (epoch 4) loss: 3.083, gen_loss: 13.117, Ret_loss 3.083, FS_loss 18.089, KL_loss: 1109205014949229.875, 
	
8975/191900 (epoch 4) loss: 3.083, gen_loss: 13.118, Ret_loss 3.083, FS_loss 18.091, KL_loss: 1104946747913707.375, 
	
8980/191900 (epoch 4) loss: 3.083, gen_loss: 13.120, Ret_loss 3.083, FS_loss 18.094, KL_loss: 1100803190044086.375, 
	
8985/191900 (epoch 4) loss: 3.083, gen_loss: 13.120, Ret_loss 3.083, FS_loss 18.094, KL_loss: 1096602826896532.375, 
	
8990/191900 (epoch 4) loss: 3.083, gen_loss: 13.120, Ret_loss 3.083, FS_loss 18.094, KL_loss: 1092472559562913.750, 
	
8995/191900 (epoch 4) loss: 3.082, gen_loss: 13.121, Ret_loss 3.082, FS_loss 18.095, KL_loss: 1088470103174724.125, 
	
9000/191900 (epoch 4) loss: 3.082, gen_loss: 13.123, Ret_loss 3.082, FS_loss 18.099, KL_loss: 1084363348556120.500, 
	
9005/191900 (epoch 4) loss: 3.082, gen_loss: 13.125, Ret_loss 3.082, FS_loss 18.103, KL_loss: 1080289357248936.750, 
	
9010/191900 (epoch 4) loss: 3.082, gen_loss: 13.126, Ret_loss 3.082, FS_loss 18.104, KL_loss: 1077506595079260.625, 
	
9015/191900 (epoch 4) loss: 3.082, gen_loss: 13.125, Ret_loss 3.082, FS_loss 18.104, KL_loss: 1073486078959361.750, 
	
9020/191900 (epoch 4) loss: 3.082, gen_loss: 13.126, Ret_loss 3.082, FS_loss 18.104, KL_loss: 1069495489353759.000, 
	
9025/191900 (epoch 4) loss: 3.082, gen_loss: 13.126, Ret_loss 3.082, FS_loss 18.107, KL_loss: 1065541006458469.500, 
	
9030/191900 (epoch 4) loss: 3.082, gen_loss: 13.127, Ret_loss 3.082, FS_loss 18.108, KL_loss: 1061609199038142.625, 
	
9035/191900 (epoch 4) loss: 3.081, gen_loss: 13.128, Ret_loss 3.081, FS_loss 18.110, KL_loss: 1057706740622347.125, 
	
9040/191900 (epoch 4) loss: 3.081, gen_loss: 13.128, Ret_loss 3.081, FS_loss 18.111, KL_loss: 2298552456035160.000, 
	
9045/191900 (epoch 4) loss: 3.081, gen_loss: 13.129, Ret_loss 3.081, FS_loss 18.112, KL_loss: 2290163788747232.500, 
	
9050/191900 (epoch 4) loss: 3.081, gen_loss: 13.129, Ret_loss 3.081, FS_loss 18.113, KL_loss: 2281839865847250.000, 
	
9055/191900 (epoch 4) loss: 3.080, gen_loss: 13.131, Ret_loss 3.080, FS_loss 18.117, KL_loss: 2273577555502447.500, 
	
9060/191900 (epoch 4) loss: 3.080, gen_loss: 13.133, Ret_loss 3.080, FS_loss 18.120, KL_loss: 2265369999718504.000, 
	
9065/191900 (epoch 4) loss: 3.079, gen_loss: 13.132, Ret_loss 3.079, FS_loss 18.120, KL_loss: 2257230210547755.500, 
	
9070/191900 (epoch 4) loss: 3.079, gen_loss: 13.133, Ret_loss 3.079, FS_loss 18.123, KL_loss: 2249146296404676.250, 
	
9075/191900 (epoch 4) loss: 3.078, gen_loss: 13.134, Ret_loss 3.078, FS_loss 18.126, KL_loss: 2241114347589640.000, 
	
9080/191900 (epoch 4) loss: 3.079, gen_loss: 13.135, Ret_loss 3.079, FS_loss 18.128, KL_loss: 2233148929853137.500, 
	
9085/191900 (epoch 4) loss: 3.079, gen_loss: 13.134, Ret_loss 3.079, FS_loss 18.129, KL_loss: 2225268506078618.250, 
	
9090/191900 (epoch 4) loss: 3.079, gen_loss: 13.135, Ret_loss 3.079, FS_loss 18.130, KL_loss: 2217410094100577.750, 
	
9095/191900 (epoch 4) loss: 3.078, gen_loss: 13.136, Ret_loss 3.078, FS_loss 18.134, KL_loss: 2209613236692359.500, 
	
9100/191900 (epoch 4) loss: 3.078, gen_loss: 13.137, Ret_loss 3.078, FS_loss 18.136, KL_loss: 2201861824025753.750, 
	
9105/191900 (epoch 4) loss: 3.078, gen_loss: 13.137, Ret_loss 3.078, FS_loss 18.137, KL_loss: 2194502739561616.000, 
	
9110/191900 (epoch 4) loss: 3.077, gen_loss: 13.137, Ret_loss 3.077, FS_loss 18.138, KL_loss: 2186878715799070.250, 
	
9115/191900 (epoch 4) loss: 3.077, gen_loss: 13.138, Ret_loss 3.077, FS_loss 18.142, KL_loss: 2179286432297104.250, 
	
9120/191900 (epoch 4) loss: 3.076, gen_loss: 13.139, Ret_loss 3.076, FS_loss 18.144, KL_loss: 2171748801032883.000, 
	
9125/191900 (epoch 4) loss: 3.076, gen_loss: 13.140, Ret_loss 3.076, FS_loss 18.147, KL_loss: 7443396273533982.000, 
	
9130/191900 (epoch 4) loss: 3.076, gen_loss: 13.140, Ret_loss 3.076, FS_loss 18.148, KL_loss: 7417819325794922.000, 
	
9135/191900 (epoch 4) loss: 3.076, gen_loss: 13.141, Ret_loss 3.076, FS_loss 18.151, KL_loss: 7392421693181455.000, 
	
9140/191900 (epoch 4) loss: 3.076, gen_loss: 13.142, Ret_loss 3.076, FS_loss 18.154, KL_loss: 7367207667617138.000, 
	
9145/191900 (epoch 4) loss: 3.076, gen_loss: 13.143, Ret_loss 3.076, FS_loss 18.156, KL_loss: 7342150834487683.000, 
	
9150/191900 (epoch 4) loss: 3.076, gen_loss: 13.144, Ret_loss 3.076, FS_loss 18.159, KL_loss: 7317309174023085.000, 
	
9155/191900 (epoch 4) loss: 3.076, gen_loss: 13.144, Ret_loss 3.076, FS_loss 18.161, KL_loss: 7292594932449333.000, 
	
9160/191900 (epoch 4) loss: 3.076, gen_loss: 13.146, Ret_loss 3.076, FS_loss 18.165, KL_loss: 7268042044408213.000, 
	
9165/191900 (epoch 4) loss: 3.076, gen_loss: 13.146, Ret_loss 3.076, FS_loss 18.168, KL_loss: 7243680121294807.000, 
	
9170/191900 (epoch 4) loss: 3.075, gen_loss: 13.145, Ret_loss 3.075, FS_loss 18.170, KL_loss: 7219623405839632.000, 
	
9175/191900 (epoch 4) loss: 3.075, gen_loss: 13.145, Ret_loss 3.075, FS_loss 18.174, KL_loss: 7195559818305129.000, 
	
9180/191900 (epoch 4) loss: 3.075, gen_loss: 13.144, Ret_loss 3.075, FS_loss 18.176, KL_loss: 7171665753319534.000, 
	
9185/191900 (epoch 4) loss: 3.074, gen_loss: 13.144, Ret_loss 3.074, FS_loss 18.179, KL_loss: 7147920768033026.000, 
	
9190/191900 (epoch 4) loss: 3.074, gen_loss: 13.143, Ret_loss 3.074, FS_loss 18.181, KL_loss: 7124342926993915.000, 
	
9195/191900 (epoch 4) loss: 3.074, gen_loss: 13.141, Ret_loss 3.074, FS_loss 18.184, KL_loss: 7100910047055848.000, 
	
9200/191900 (epoch 4) loss: 3.075, gen_loss: 13.140, Ret_loss 3.075, FS_loss 18.186, KL_loss: 7077629106853994.000, 
	
9205/191900 (epoch 4) loss: 3.074, gen_loss: 13.140, Ret_loss 3.074, FS_loss 18.190, KL_loss: 7054548715672186.000, 
	
9210/191900 (epoch 4) loss: 3.073, gen_loss: 13.138, Ret_loss 3.073, FS_loss 18.193, KL_loss: 7031570910723485.000, 
	
9215/191900 (epoch 4) loss: 3.073, gen_loss: 13.137, Ret_loss 3.073, FS_loss 18.196, KL_loss: 7008837300089904.000, 
	
9220/191900 (epoch 4) loss: 3.073, gen_loss: 13.135, Ret_loss 3.073, FS_loss 18.199, KL_loss: 6986156056758576.000, 
	
9225/191900 (epoch 4) loss: 3.072, gen_loss: 13.133, Ret_loss 3.072, FS_loss 18.201, KL_loss: 6963621029875054.000, 
	
9230/191900 (epoch 4) loss: 3.073, gen_loss: 13.131, Ret_loss 3.073, FS_loss 18.202, KL_loss: 6951864016186180.000, 
	
9235/191900 (epoch 4) loss: 3.072, gen_loss: 13.130, Ret_loss 3.072, FS_loss 18.206, KL_loss: 6929582792650193.000, 
	
9240/191900 (epoch 4) loss: 3.072, gen_loss: 13.129, Ret_loss 3.072, FS_loss 18.209, KL_loss: 6907444815918679.000, 
	
9245/191900 (epoch 4) loss: 3.073, gen_loss: 13.127, Ret_loss 3.073, FS_loss 18.211, KL_loss: 6885463020805035.000, 
	
9250/191900 (epoch 4) loss: 3.073, gen_loss: 13.127, Ret_loss 3.073, FS_loss 18.214, KL_loss: 6863604964182160.000, 
	
9255/191900 (epoch 4) loss: 3.073, gen_loss: 13.125, Ret_loss 3.073, FS_loss 18.216, KL_loss: 6841909794890659.000, 
	
9260/191900 (epoch 4) loss: 3.073, gen_loss: 13.125, Ret_loss 3.073, FS_loss 18.219, KL_loss: 6820327270734500.000, 
	
9265/191900 (epoch 4) loss: 3.072, gen_loss: 13.125, Ret_loss 3.072, FS_loss 18.223, KL_loss: 6798882066517648.000, 
	
9270/191900 (epoch 4) loss: 3.072, gen_loss: 13.123, Ret_loss 3.072, FS_loss 18.224, KL_loss: 6777623603027642.000, 
	
9275/191900 (epoch 4) loss: 3.072, gen_loss: 13.123, Ret_loss 3.072, FS_loss 18.227, KL_loss: 6756443973965135.000, 
	
9280/191900 (epoch 4) loss: 3.072, gen_loss: 13.121, Ret_loss 3.072, FS_loss 18.228, KL_loss: 6735928900502543.000, 
	
9285/191900 (epoch 4) loss: 3.071, gen_loss: 13.120, Ret_loss 3.071, FS_loss 18.231, KL_loss: 6715019214618917.000, 
	
9290/191900 (epoch 4) loss: 3.071, gen_loss: 13.120, Ret_loss 3.071, FS_loss 18.235, KL_loss: 6694236590608333.000, 
	
9295/191900 (epoch 4) loss: 3.071, gen_loss: 13.118, Ret_loss 3.071, FS_loss 18.236, KL_loss: 6673590433426361.000, 
	
9300/191900 (epoch 4) loss: 3.071, gen_loss: 13.118, Ret_loss 3.071, FS_loss 18.239, KL_loss: 6653057890974522.000, 
	
9305/191900 (epoch 4) loss: 3.070, gen_loss: 13.117, Ret_loss 3.070, FS_loss 18.242, KL_loss: 6632662777269018.000, 
	
9310/191900 (epoch 4) loss: 3.069, gen_loss: 13.116, Ret_loss 3.069, FS_loss 18.245, KL_loss: 6612388014209867.000, 
	
9315/191900 (epoch 4) loss: 3.069, gen_loss: 13.116, Ret_loss 3.069, FS_loss 18.248, KL_loss: 6592262526334594.000, 
	
9320/191900 (epoch 4) loss: 3.069, gen_loss: 13.115, Ret_loss 3.069, FS_loss 18.251, KL_loss: 6572226098522955.000, 
	
9325/191900 (epoch 4) loss: 3.068, gen_loss: 13.114, Ret_loss 3.068, FS_loss 18.252, KL_loss: 6552313705896840.000, 
	
9330/191900 (epoch 4) loss: 3.068, gen_loss: 13.114, Ret_loss 3.068, FS_loss 18.256, KL_loss: 6532732246972749.000, 
	
9335/191900 (epoch 4) loss: 3.068, gen_loss: 13.113, Ret_loss 3.068, FS_loss 18.258, KL_loss: 6513055461887888.000, 
	
9340/191900 (epoch 4) loss: 3.068, gen_loss: 13.112, Ret_loss 3.068, FS_loss 18.260, KL_loss: 6493703110622776.000, 
	
9345/191900 (epoch 4) loss: 3.068, gen_loss: 13.111, Ret_loss 3.068, FS_loss 18.261, KL_loss: 6474540903773074.000, 
	
9350/191900 (epoch 4) loss: 3.068, gen_loss: 13.110, Ret_loss 3.068, FS_loss 18.264, KL_loss: 6455214051562014.000, 
	
9355/191900 (epoch 4) loss: 3.068, gen_loss: 13.109, Ret_loss 3.068, FS_loss 18.265, KL_loss: 6436013933184991.000, 
	
9360/191900 (epoch 4) loss: 3.068, gen_loss: 13.107, Ret_loss 3.068, FS_loss 18.267, KL_loss: 6416918385503730.000, 
	
9365/191900 (epoch 4) loss: 3.067, gen_loss: 13.107, Ret_loss 3.067, FS_loss 18.270, KL_loss: 6397934582649745.000, 
	
9370/191900 (epoch 4) loss: 3.067, gen_loss: 13.106, Ret_loss 3.067, FS_loss 18.272, KL_loss: 6379126381217277.000, 
	
9375/191900 (epoch 4) loss: 3.066, gen_loss: 13.105, Ret_loss 3.066, FS_loss 18.274, KL_loss: 6360364453932930.000, 
	
9380/191900 (epoch 4) loss: 3.067, gen_loss: 13.104, Ret_loss 3.067, FS_loss 18.277, KL_loss: 6341979082500103.000, 
	
9385/191900 (epoch 4) loss: 3.067, gen_loss: 13.103, Ret_loss 3.067, FS_loss 18.279, KL_loss: 6323436322126635.000, 
	
9390/191900 (epoch 4) loss: 3.067, gen_loss: 13.103, Ret_loss 3.067, FS_loss 18.282, KL_loss: 6305001268256318.000, 
	
9395/191900 (epoch 4) loss: 3.067, gen_loss: 13.102, Ret_loss 3.067, FS_loss 18.284, KL_loss: 6286713011695372.000, 
	
9400/191900 (epoch 4) loss: 3.066, gen_loss: 13.101, Ret_loss 3.066, FS_loss 18.287, KL_loss: 6268491117968481.000, 
	
9405/191900 (epoch 4) loss: 3.066, gen_loss: 13.100, Ret_loss 3.066, FS_loss 18.290, KL_loss: 6250375522793989.000, 
	
9410/191900 (epoch 4) loss: 3.066, gen_loss: 13.100, Ret_loss 3.066, FS_loss 18.292, KL_loss: 6232398683018629.000, 
	
9415/191900 (epoch 4) loss: 3.065, gen_loss: 13.098, Ret_loss 3.065, FS_loss 18.294, KL_loss: 6214489717904378.000, 
	
9420/191900 (epoch 4) loss: 3.065, gen_loss: 13.098, Ret_loss 3.065, FS_loss 18.298, KL_loss: 6196684429989562.000, 
	
9425/191900 (epoch 4) loss: 3.064, gen_loss: 13.097, Ret_loss 3.064, FS_loss 18.300, KL_loss: 6179000433396039.000, 
	
9430/191900 (epoch 4) loss: 3.064, gen_loss: 13.096, Ret_loss 3.064, FS_loss 18.303, KL_loss: 6161397687963479.000, 
	
9435/191900 (epoch 4) loss: 3.065, gen_loss: 13.095, Ret_loss 3.065, FS_loss 18.306, KL_loss: 6144458880138348.000, 
	
9440/191900 (epoch 4) loss: 3.064, gen_loss: 13.094, Ret_loss 3.064, FS_loss 18.308, KL_loss: 6127054323152392.000, 
	
9445/191900 (epoch 4) loss: 3.064, gen_loss: 13.094, Ret_loss 3.064, FS_loss 18.310, KL_loss: 6109746907218620.000, 
	
9450/191900 (epoch 4) loss: 3.064, gen_loss: 13.094, Ret_loss 3.064, FS_loss 18.313, KL_loss: 6092562880616697.000, 
	
9455/191900 (epoch 4) loss: 3.063, gen_loss: 13.094, Ret_loss 3.063, FS_loss 18.316, KL_loss: 6075452828799921.000, 
	
9460/191900 (epoch 4) loss: 3.063, gen_loss: 13.093, Ret_loss 3.063, FS_loss 18.317, KL_loss: 6058445873945661.000, 
	
9465/191900 (epoch 4) loss: 3.064, gen_loss: 13.093, Ret_loss 3.064, FS_loss 18.320, KL_loss: 6041523417803666.000, 
	
9470/191900 (epoch 4) loss: 3.063, gen_loss: 13.092, Ret_loss 3.063, FS_loss 18.322, KL_loss: 6024695694047510.000, 
	
9475/191900 (epoch 4) loss: 3.063, gen_loss: 13.092, Ret_loss 3.063, FS_loss 18.325, KL_loss: 6008068460135903.000, 
	
9480/191900 (epoch 4) loss: 3.063, gen_loss: 13.091, Ret_loss 3.063, FS_loss 18.327, KL_loss: 5991437467305081.000, 
	
9485/191900 (epoch 4) loss: 3.063, gen_loss: 13.091, Ret_loss 3.063, FS_loss 18.329, KL_loss: 5974900448398967.000, 
	
9490/191900 (epoch 4) loss: 3.063, gen_loss: 13.090, Ret_loss 3.063, FS_loss 18.331, KL_loss: 5958515899294532.000, 
	
9495/191900 (epoch 4) loss: 3.063, gen_loss: 13.089, Ret_loss 3.063, FS_loss 18.333, KL_loss: 5942152600594870.000, 
	
9500/191900 (epoch 4) loss: 3.062, gen_loss: 13.089, Ret_loss 3.062, FS_loss 18.335, KL_loss: 5925873307937823.000, 
	
9505/191900 (epoch 4) loss: 3.062, gen_loss: 13.088, Ret_loss 3.062, FS_loss 18.337, KL_loss: 5929648491160377.000, 
	
9510/191900 (epoch 4) loss: 3.062, gen_loss: 13.088, Ret_loss 3.062, FS_loss 18.340, KL_loss: 5913506516026059.000, 
	
9515/191900 (epoch 4) loss: 3.062, gen_loss: 13.087, Ret_loss 3.062, FS_loss 18.341, KL_loss: 5897441452963868.000, 
	
9520/191900 (epoch 4) loss: 3.061, gen_loss: 13.087, Ret_loss 3.061, FS_loss 18.344, KL_loss: 5881462152523495.000, 
	
9525/191900 (epoch 4) loss: 3.061, gen_loss: 13.086, Ret_loss 3.061, FS_loss 18.346, KL_loss: 5865579314976444.000, 
	
9530/191900 (epoch 4) loss: 3.061, gen_loss: 13.085, Ret_loss 3.061, FS_loss 18.346, KL_loss: 5849837108028616.000, 
	
9535/191900 (epoch 4) loss: 3.061, gen_loss: 13.083, Ret_loss 3.061, FS_loss 18.347, KL_loss: 5834318995016743.000, 
	
9540/191900 (epoch 4) loss: 3.061, gen_loss: 13.083, Ret_loss 3.061, FS_loss 18.349, KL_loss: 5818684564838292.000, 
	
9545/191900 (epoch 4) loss: 3.061, gen_loss: 13.083, Ret_loss 3.061, FS_loss 18.352, KL_loss: 5803129488040673.000, 
	
9550/191900 (epoch 4) loss: 3.060, gen_loss: 13.083, Ret_loss 3.060, FS_loss 18.355, KL_loss: 5787717302913339.000, 
	
9555/191900 (epoch 4) loss: 3.060, gen_loss: 13.082, Ret_loss 3.060, FS_loss 18.356, KL_loss: 5772324624849808.000, 
	
9560/191900 (epoch 4) loss: 3.060, gen_loss: 13.082, Ret_loss 3.060, FS_loss 18.359, KL_loss: 5757021438452256.000, 
	
9565/191900 (epoch 4) loss: 3.059, gen_loss: 13.082, Ret_loss 3.059, FS_loss 18.361, KL_loss: 5741791481974339.000, 
	
9570/191900 (epoch 4) loss: 3.059, gen_loss: 13.082, Ret_loss 3.059, FS_loss 18.364, KL_loss: 5726656061202394.000, 
	
9575/191900 (epoch 4) loss: 3.059, gen_loss: 13.082, Ret_loss 3.059, FS_loss 18.366, KL_loss: 5711587251555551.000, 
	
9580/191900 (epoch 4) loss: 3.059, gen_loss: 13.082, Ret_loss 3.059, FS_loss 18.368, KL_loss: 5696604239078577.000, 
	
9585/191900 (epoch 4) loss: 3.059, gen_loss: 13.082, Ret_loss 3.059, FS_loss 18.371, KL_loss: 5682536118308822.000, 
	
9590/191900 (epoch 4) loss: 3.058, gen_loss: 13.081, Ret_loss 3.058, FS_loss 18.371, KL_loss: 5667699241015866.000, 
	
9595/191900 (epoch 5) loss: 2.934, gen_loss: 12.658, Ret_loss 2.934, FS_loss 18.432, KL_loss: 1871798599680.000, 
	
9600/191900 (epoch 5) loss: 2.932, gen_loss: 12.915, Ret_loss 2.932, FS_loss 19.066, KL_loss: 471374304597.333, 
	
9605/191900 (epoch 5) loss: 2.921, gen_loss: 12.899, Ret_loss 2.921, FS_loss 19.141, KL_loss: 312463595706.182, 
	
9610/191900 (epoch 5) loss: 2.909, gen_loss: 12.890, Ret_loss 2.909, FS_loss 19.046, KL_loss: 1926048837888.000, 
	
9615/191900 (epoch 5) loss: 2.923, gen_loss: 12.948, Ret_loss 2.923, FS_loss 19.156, KL_loss: 1638448549888.000, 
	
9620/191900 (epoch 5) loss: 2.914, gen_loss: 13.004, Ret_loss 2.914, FS_loss 19.199, KL_loss: 2138296448708.923, 
	
9625/191900 (epoch 5) loss: 2.924, gen_loss: 12.963, Ret_loss 2.924, FS_loss 19.126, KL_loss: 1906378181334.710, 
	
9630/191900 (epoch 5) loss: 2.910, gen_loss: 12.973, Ret_loss 2.910, FS_loss 19.128, KL_loss: 745174189949496.875, 
	
9635/191900 (epoch 5) loss: 2.902, gen_loss: 12.972, Ret_loss 2.902, FS_loss 19.110, KL_loss: 654299486044413.625, 
	
9640/191900 (epoch 5) loss: 2.904, gen_loss: 12.965, Ret_loss 2.904, FS_loss 19.098, KL_loss: 583180170382511.250, 
	
9645/191900 (epoch 5) loss: 2.925, gen_loss: 12.975, Ret_loss 2.925, FS_loss 19.096, KL_loss: 526007944446027.312, 
	
9650/191900 (epoch 5) loss: 2.932, gen_loss: 12.962, Ret_loss 2.932, FS_loss 19.066, KL_loss: 479043091804048.000, 
	
9655/191900 (epoch 5) loss: 2.938, gen_loss: 12.968, Ret_loss 2.938, FS_loss 19.071, KL_loss: 439784565083167.500, 
	
9660/191900 (epoch 5) loss: 2.943, gen_loss: 12.976, Ret_loss 2.943, FS_loss 19.071, KL_loss: 406468321704135.750, 
	
9665/191900 (epoch 5) loss: 2.946, gen_loss: 12.973, Ret_loss 2.946, FS_loss 19.060, KL_loss: 377846110422829.062, 
	
9670/191900 (epoch 5) loss: 2.952, gen_loss: 12.996, Ret_loss 2.952, FS_loss 19.092, KL_loss: 353022093183452.625, 
	
9675/191900 (epoch 5) loss: 2.957, gen_loss: 13.003, Ret_loss 2.957, FS_loss 19.099, KL_loss: 331232802330717.250, 
	
9680/191900 (epoch 5) loss: 2.955, gen_loss: 13.008, Ret_loss 2.955, FS_loss 19.104, KL_loss: 315553411993568.750, 
	
9685/191900 (epoch 5) loss: 2.949, gen_loss: 13.009, Ret_loss 2.949, FS_loss 19.105, KL_loss: 298220521994638.062, 
	
9690/191900 (epoch 5) loss: 2.952, gen_loss: 13.011, Ret_loss 2.952, FS_loss 19.109, KL_loss: 282714201384078.688, 
	
9695/191900 (epoch 5) loss: 2.959, gen_loss: 13.022, Ret_loss 2.959, FS_loss 19.121, KL_loss: 304393538774985.500, 
	
9700/191900 (epoch 5) loss: 2.958, gen_loss: 13.020, Ret_loss 2.958, FS_loss 19.114, KL_loss: 290035523953967.125, 
	
9705/191900 (epoch 5) loss: 2.954, gen_loss: 13.028, Ret_loss 2.954, FS_loss 19.117, KL_loss: 276987912765655.625, 
	
9710/191900 (epoch 5) loss: 2.958, gen_loss: 13.028, Ret_loss 2.958, FS_loss 19.117, KL_loss: 265049629563474.750, 
	
9715/191900 (epoch 5) loss: 2.958, gen_loss: 13.035, Ret_loss 2.958, FS_loss 19.132, KL_loss: 254100372515775.469, 
	
9720/191900 (epoch 5) loss: 2.959, gen_loss: 13.045, Ret_loss 2.959, FS_loss 19.147, KL_loss: 244079476071240.125, 
	
9725/191900 (epoch 5) loss: 2.961, gen_loss: 13.037, Ret_loss 2.961, FS_loss 19.135, KL_loss: 234765853925840.125, 
	
9730/191900 (epoch 5) loss: 2.958, gen_loss: 13.035, Ret_loss 2.958, FS_loss 19.131, KL_loss: 226345769081821.188, 
	
9735/191900 (epoch 5) loss: 2.961, gen_loss: 13.039, Ret_loss 2.961, FS_loss 19.142, KL_loss: 218326043010733.375, 
	
9740/191900 (epoch 5) loss: 2.963, gen_loss: 13.038, Ret_loss 2.963, FS_loss 19.142, KL_loss: 210857649117404.062, 
	
9745/191900 (epoch 5) loss: 2.962, gen_loss: 13.046, Ret_loss 2.962, FS_loss 19.150, KL_loss: 203949907204268.094, 
	
9750/191900 (epoch 5) loss: 2.964, gen_loss: 13.049, Ret_loss 2.964, FS_loss 19.154, KL_loss: 197416767116914.062, 
	
9755/191900 (epoch 5) loss: 2.963, gen_loss: 13.049, Ret_loss 2.963, FS_loss 19.150, KL_loss: 191604065594980.969, 
	
9760/191900 (epoch 5) loss: 2.965, gen_loss: 13.051, Ret_loss 2.965, FS_loss 19.147, KL_loss: 185844634694047.625, 
	
9765/191900 (epoch 5) loss: 2.963, gen_loss: 13.059, Ret_loss 2.963, FS_loss 19.154, KL_loss: 180421924333935.531, 
	
9770/191900 (epoch 5) loss: 2.963, gen_loss: 13.061, Ret_loss 2.963, FS_loss 19.154, KL_loss: 175466482394643.625, 
	
9775/191900 (epoch 5) loss: 2.965, gen_loss: 13.064, Ret_loss 2.965, FS_loss 19.157, KL_loss: 170748049304600.750, 
	
9780/191900 (epoch 5) loss: 2.957, gen_loss: 13.068, Ret_loss 2.957, FS_loss 19.165, KL_loss: 167447409114317.750, 
	
9785/191900 (epoch 5) loss: 2.955, gen_loss: 13.072, Ret_loss 2.955, FS_loss 19.166, KL_loss: 163069201862309.531, 
	
9790/191900 (epoch 5) loss: 2.956, gen_loss: 13.079, Ret_loss 2.956, FS_loss 19.176, KL_loss: 158928086313980.750, 
	
9795/191900 (epoch 5) loss: 2.959, gen_loss: 13.082, Ret_loss 2.959, FS_loss 19.183, KL_loss: 155365017296261.094, 
	
9800/191900 (epoch 5) loss: 2.959, gen_loss: 13.078, Ret_loss 2.959, FS_loss 19.183, KL_loss: 151598319038480.781, 
	
9805/191900 (epoch 5) loss: 2.959, gen_loss: 13.082, Ret_loss 2.959, FS_loss 19.191, KL_loss: 148148686438377.562, 
	
9810/191900 (epoch 5) loss: 2.959, gen_loss: 13.088, Ret_loss 2.959, FS_loss 19.206, KL_loss: 144736402779910.531, 
	
9815/191900 (epoch 5) loss: 2.958, gen_loss: 13.091, Ret_loss 2.958, FS_loss 19.215, KL_loss: 141549744499621.062, 
	
9820/191900 (epoch 5) loss: 2.958, gen_loss: 13.095, Ret_loss 2.958, FS_loss 19.225, KL_loss: 139943946762001.562, 
	
9825/191900 (epoch 5) loss: 2.960, gen_loss: 13.096, Ret_loss 2.960, FS_loss 19.225, KL_loss: 136916112660645.672, 
	
9830/191900 (epoch 5) loss: 2.960, gen_loss: 13.096, Ret_loss 2.960, FS_loss 19.227, KL_loss: 135326041828748.469, 
	
9835/191900 (epoch 5) loss: 2.959, gen_loss: 13.097, Ret_loss 2.959, FS_loss 19.233, KL_loss: 132524921811808.125, 
	
9840/191900 (epoch 5) loss: 2.957, gen_loss: 13.102, Ret_loss 2.957, FS_loss 19.241, KL_loss: 129837156119857.438, 
	
9845/191900 (epoch 5) loss: 2.957, gen_loss: 13.106, Ret_loss 2.957, FS_loss 19.248, KL_loss: 127341069057229.516, 
	
9850/191900 (epoch 5) loss: 2.954, gen_loss: 13.110, Ret_loss 2.954, FS_loss 19.262, KL_loss: 124859650994109.500, 
	
9855/191900 (epoch 5) loss: 2.952, gen_loss: 13.110, Ret_loss 2.952, FS_loss 19.264, KL_loss: 122470582924375.781, 
	
9860/191900 (epoch 5) loss: 2.952, gen_loss: 13.107, Ret_loss 2.952, FS_loss 19.264, KL_loss: 120439192403565.234, 
	
9865/191900 (epoch 5) loss: 2.952, gen_loss: 13.110, Ret_loss 2.952, FS_loss 19.268, KL_loss: 118220484542582.547, 
	
9870/191900 (epoch 5) loss: 2.950, gen_loss: 13.110, Ret_loss 2.950, FS_loss 19.267, KL_loss: 116416005044607.531, 
	
9875/191900 (epoch 5) loss: 2.949, gen_loss: 13.114, Ret_loss 2.949, FS_loss 19.278, KL_loss: 114374220856583.750, 
	
9880/191900 (epoch 5) loss: 2.950, gen_loss: 13.113, Ret_loss 2.950, FS_loss 19.279, KL_loss: 112386980489743.672, 
	
9885/191900 (epoch 5) loss: 2.950, gen_loss: 13.121, Ret_loss 2.950, FS_loss 19.293, KL_loss: 110474959464115.031, 
	
9890/191900 (epoch 5) loss: 2.951, gen_loss: 13.119, Ret_loss 2.951, FS_loss 19.293, KL_loss: 108860577234277.625, 
	
9895/191900 (epoch 5) loss: 2.953, gen_loss: 13.118, Ret_loss 2.953, FS_loss 19.293, KL_loss: 107120095194875.328, 
	
9900/191900 (epoch 5) loss: 2.955, gen_loss: 13.123, Ret_loss 2.955, FS_loss 19.299, KL_loss: 105440439736170.672, 
	
9905/191900 (epoch 5) loss: 2.951, gen_loss: 13.126, Ret_loss 2.951, FS_loss 19.305, KL_loss: 103776730670081.234, 
	
9910/191900 (epoch 5) loss: 2.953, gen_loss: 13.126, Ret_loss 2.953, FS_loss 19.306, KL_loss: 102314234079566.984, 
	
9915/191900 (epoch 5) loss: 2.951, gen_loss: 13.126, Ret_loss 2.951, FS_loss 19.307, KL_loss: 100724378351314.141, 
	
9920/191900 (epoch 5) loss: 2.951, gen_loss: 13.129, Ret_loss 2.951, FS_loss 19.316, KL_loss: 100038975328379.688, 
	
9925/191900 (epoch 5) loss: 2.951, gen_loss: 13.129, Ret_loss 2.951, FS_loss 19.316, KL_loss: 98528203664112.922, 
	
9930/191900 (epoch 5) loss: 2.950, gen_loss: 13.132, Ret_loss 2.950, FS_loss 19.327, KL_loss: 97096635654928.375, 
	
9935/191900 (epoch 5) loss: 2.952, gen_loss: 13.129, Ret_loss 2.952, FS_loss 19.328, KL_loss: 95675894984095.531, 
	
9940/191900 (epoch 5) loss: 2.954, gen_loss: 13.129, Ret_loss 2.954, FS_loss 19.330, KL_loss: 94372056842244.062, 
	
9945/191900 (epoch 5) loss: 2.953, gen_loss: 13.125, Ret_loss 2.953, FS_loss 19.325, KL_loss: 93054554039559.656, 
	
9950/191900 (epoch 5) loss: 2.952, gen_loss: 13.122, Ret_loss 2.952, FS_loss 19.327, KL_loss: 91764480411905.078, 
	
9955/191900 (epoch 5) loss: 2.954, gen_loss: 13.122, Ret_loss 2.954, FS_loss 19.330, KL_loss: 91352887600968.688, 
	
9960/191900 (epoch 5) loss: 2.953, gen_loss: 13.126, Ret_loss 2.953, FS_loss 19.337, KL_loss: 90106329523657.094, 
	
9965/191900 (epoch 5) loss: 2.951, gen_loss: 13.129, Ret_loss 2.951, FS_loss 19.343, KL_loss: 89061748039849.406, 
	
9970/191900 (epoch 5) loss: 2.949, gen_loss: 13.127, Ret_loss 2.949, FS_loss 19.343, KL_loss: 87878861964389.781, 
	
9975/191900 (epoch 5) loss: 2.950, gen_loss: 13.127, Ret_loss 2.950, FS_loss 19.347, KL_loss: 100370766755042.766, 
	
9980/191900 (epoch 5) loss: 2.949, gen_loss: 13.125, Ret_loss 2.949, FS_loss 19.351, KL_loss: 99074400031498.281, 
	
9985/191900 (epoch 5) loss: 2.949, gen_loss: 13.128, Ret_loss 2.949, FS_loss 19.364, KL_loss: 97860145351492.422, 
	
9990/191900 (epoch 5) loss: 2.949, gen_loss: 13.129, Ret_loss 2.949, FS_loss 19.374, KL_loss: 96628124114854.469, 
	
9995/191900 (epoch 5) loss: 2.948, gen_loss: 13.132, Ret_loss 2.948, FS_loss 19.387, KL_loss: 95448576886935.625, 
	
10000/191900 (epoch 5) loss: 2.947, gen_loss: 13.130, Ret_loss 2.947, FS_loss 19.389, KL_loss: 94352338932936.203, 
	
10005/191900 (epoch 5) loss: 2.947, gen_loss: 13.133, Ret_loss 2.947, FS_loss 19.396, KL_loss: 93213206390981.766, 
	
10010/191900 (epoch 5) loss: 2.945, gen_loss: 13.134, Ret_loss 2.945, FS_loss 19.406, KL_loss: 92121480979764.609, 
	
10015/191900 (epoch 5) loss: 2.944, gen_loss: 13.135, Ret_loss 2.944, FS_loss 19.416, KL_loss: 91098310939269.469, 
	
10020/191900 (epoch 5) loss: 2.943, gen_loss: 13.135, Ret_loss 2.943, FS_loss 19.423, KL_loss: 90033365684352.297, 
	
10025/191900 (epoch 5) loss: 2.943, gen_loss: 13.135, Ret_loss 2.943, FS_loss 19.428, KL_loss: 88999095562908.516, 
	
10030/191900 (epoch 5) loss: 2.943, gen_loss: 13.137, Ret_loss 2.943, FS_loss 19.435, KL_loss: 88134954599502.391, 
	
10035/191900 (epoch 5) loss: 2.941, gen_loss: 13.135, Ret_loss 2.941, FS_loss 19.440, KL_loss: 87137691166504.922, 
	
10040/191900 (epoch 5) loss: 2.941, gen_loss: 13.136, Ret_loss 2.941, FS_loss 19.446, KL_loss: 86434702782145.719, 
	
10045/191900 (epoch 5) loss: 2.942, gen_loss: 13.139, Ret_loss 2.942, FS_loss 19.453, KL_loss: 85476827139899.312, 
	
10050/191900 (epoch 5) loss: 2.941, gen_loss: 13.139, Ret_loss 2.941, FS_loss 19.460, KL_loss: 84541028660698.672, 
	
10055/191900 (epoch 5) loss: 2.943, gen_loss: 13.138, Ret_loss 2.943, FS_loss 19.463, KL_loss: 83719662787549.297, 
	
10060/191900 (epoch 5) loss: 2.943, gen_loss: 13.138, Ret_loss 2.943, FS_loss 19.469, KL_loss: 82822496489127.828, 
	
10065/191900 (epoch 5) loss: 2.945, gen_loss: 13.139, Ret_loss 2.945, FS_loss 19.475, KL_loss: 81992625846257.594, 
	
10070/191900 (epoch 5) loss: 2.944, gen_loss: 13.142, Ret_loss 2.944, FS_loss 19.487, KL_loss: 81135320222357.250, 
	
10075/191900 (epoch 5) loss: 2.944, gen_loss: 13.145, Ret_loss 2.944, FS_loss 19.499, KL_loss: 80305265685432.422, 
	
10080/191900 (epoch 5) loss: 2.945, gen_loss: 13.145, Ret_loss 2.945, FS_loss 19.505, KL_loss: 79625296165385.219, 
	
10085/191900 (epoch 5) loss: 2.945, gen_loss: 13.144, Ret_loss 2.945, FS_loss 19.509, KL_loss: 78816046625000.281, 
	
10090/191900 (epoch 5) loss: 2.946, gen_loss: 13.144, Ret_loss 2.946, FS_loss 19.515, KL_loss: 78512576981692.641, 
	
10095/191900 (epoch 5) loss: 2.947, gen_loss: 13.144, Ret_loss 2.947, FS_loss 19.522, KL_loss: 77729928949112.844, 
	
10100/191900 (epoch 5) loss: 2.947, gen_loss: 13.142, Ret_loss 2.947, FS_loss 19.526, KL_loss: 76965191165529.797, 
	
10105/191900 (epoch 5) loss: 2.948, gen_loss: 13.143, Ret_loss 2.948, FS_loss 19.534, KL_loss: 76359295743874.500, 
	
10110/191900 (epoch 5) loss: 2.947, gen_loss: 13.142, Ret_loss 2.947, FS_loss 19.542, KL_loss: 75621047446034.609, 
	
10115/191900 (epoch 5) loss: 2.947, gen_loss: 13.142, Ret_loss 2.947, FS_loss 19.550, KL_loss: 74980996870693.094, 
	
10120/191900 (epoch 5) loss: 2.948, gen_loss: 13.142, Ret_loss 2.948, FS_loss 19.556, KL_loss: 74275811814511.703, 
	
10125/191900 (epoch 5) loss: 2.947, gen_loss: 13.139, Ret_loss 2.947, FS_loss 19.558, KL_loss: 73579032480263.469, 
	
10130/191900 (epoch 5) loss: 2.948, gen_loss: 13.141, Ret_loss 2.948, FS_loss 19.569, KL_loss: 75096126815882.266, 
	
10135/191900 (epoch 5) loss: 2.947, gen_loss: 13.141, Ret_loss 2.947, FS_loss 19.577, KL_loss: 74402155245810.047, 
	
10140/191900 (epoch 5) loss: 2.948, gen_loss: 13.141, Ret_loss 2.948, FS_loss 19.584, KL_loss: 73725828015278.188, 
	
10145/191900 (epoch 5) loss: 2.948, gen_loss: 13.144, Ret_loss 2.948, FS_loss 19.593, KL_loss: 73057058222750.672, 
	
10150/191900 (epoch 5) loss: 2.947, gen_loss: 13.144, Ret_loss 2.947, FS_loss 19.601, KL_loss: 72422254418960.344, 
	
10155/191900 (epoch 5) loss: 2.947, gen_loss: 13.141, Ret_loss 2.947, FS_loss 19.603, KL_loss: 71777108332950.812, 
	
10160/191900 (epoch 5) loss: 2.947, gen_loss: 13.140, Ret_loss 2.947, FS_loss 19.610, KL_loss: 71249338171534.703, 
	
10165/191900 (epoch 5) loss: 2.947, gen_loss: 13.140, Ret_loss 2.947, FS_loss 19.617, KL_loss: 70628205606691.188, 
	
10170/191900 (epoch 5) loss: 2.946, gen_loss: 13.140, Ret_loss 2.946, FS_loss 19.625, KL_loss: 70053522404805.109, 
	
10175/191900 (epoch 5) loss: 2.947, gen_loss: 13.139, Ret_loss 2.947, FS_loss 19.631, KL_loss: 69452098416066.977, 
	
10180/191900 (epoch 5) loss: 2.946, gen_loss: 13.139, Ret_loss 2.946, FS_loss 19.637, KL_loss: 68860752017972.203, 
	
10185/191900 (epoch 5) loss: 2.946, gen_loss: 13.139, Ret_loss 2.946, FS_loss 19.644, KL_loss: 68293441624432.836, 
	
10190/191900 (epoch 5) loss: 2.946, gen_loss: 13.139, Ret_loss 2.946, FS_loss 19.653, KL_loss: 67721549530254.391, 
	
10195/191900 (epoch 5) loss: 2.946, gen_loss: 13.137, Ret_loss 2.946, FS_loss 19.657, KL_loss: 67604379336661.188, 
	
10200/191900 (epoch 5) loss: 2.945, gen_loss: 13.138, Ret_loss 2.945, FS_loss 19.666, KL_loss: 67057945460855.766, 
	
10205/191900 (epoch 5) loss: 2.945, gen_loss: 13.137, Ret_loss 2.945, FS_loss 19.673, KL_loss: 66643942873391.133, 
	
10210/191900 (epoch 5) loss: 2.944, gen_loss: 13.139, Ret_loss 2.944, FS_loss 19.681, KL_loss: 66129838671058.906, 
	
10215/191900 (epoch 5) loss: 2.944, gen_loss: 13.139, Ret_loss 2.944, FS_loss 19.685, KL_loss: 65635482813403.516, 
	
10220/191900 (epoch 5) loss: 2.944, gen_loss: 13.140, Ret_loss 2.944, FS_loss 19.692, KL_loss: 65163938612886.289, 
	
10225/191900 (epoch 5) loss: 2.945, gen_loss: 13.141, Ret_loss 2.945, FS_loss 19.697, KL_loss: 64655397018815.289, 
	
10230/191900 (epoch 5) loss: 2.946, gen_loss: 13.139, Ret_loss 2.946, FS_loss 19.699, KL_loss: 64157510066959.898, 
	
10235/191900 (epoch 5) loss: 2.947, gen_loss: 13.140, Ret_loss 2.947, FS_loss 19.706, KL_loss: 63666161729214.703, 
	
10240/191900 (epoch 5) loss: 2.948, gen_loss: 13.140, Ret_loss 2.948, FS_loss 19.712, KL_loss: 63214251624997.844, 
	
10245/191900 (epoch 5) loss: 2.947, gen_loss: 13.141, Ret_loss 2.947, FS_loss 19.721, KL_loss: 62735724958619.133, 
	
10250/191900 (epoch 5) loss: 2.947, gen_loss: 13.143, Ret_loss 2.947, FS_loss 19.728, KL_loss: 62262444088155.906, 
	
10255/191900 (epoch 5) loss: 2.947, gen_loss: 13.143, Ret_loss 2.947, FS_loss 19.734, KL_loss: 61830748044132.891, 
	
10260/191900 (epoch 5) loss: 2.947, gen_loss: 13.145, Ret_loss 2.947, FS_loss 19.742, KL_loss: 61491807358310.055, 
	
10265/191900 (epoch 5) loss: 2.947, gen_loss: 13.144, Ret_loss 2.947, FS_loss 19.745, KL_loss: 61035209534295.938, 
	
10270/191900 (epoch 5) loss: 2.946, gen_loss: 13.146, Ret_loss 2.946, FS_loss 19.754, KL_loss: 61337643439593.086, 
	
10275/191900 (epoch 5) loss: 2.944, gen_loss: 13.146, Ret_loss 2.944, FS_loss 19.763, KL_loss: 60887842048524.594, 
	
10280/191900 (epoch 5) loss: 2.944, gen_loss: 13.148, Ret_loss 2.944, FS_loss 19.771, KL_loss: 60456483828605.945, 
	
10285/191900 (epoch 5) loss: 2.943, gen_loss: 13.149, Ret_loss 2.943, FS_loss 19.777, KL_loss: 60019900966118.992, 
	
10290/191900 (epoch 5) loss: 2.942, gen_loss: 13.148, Ret_loss 2.942, FS_loss 19.781, KL_loss: 59592381897326.164, 
	
10295/191900 (epoch 5) loss: 2.942, gen_loss: 13.148, Ret_loss 2.942, FS_loss 19.786, KL_loss: 59188221852292.016, 
	
10300/191900 (epoch 5) loss: 2.943, gen_loss: 13.149, Ret_loss 2.943, FS_loss 19.793, KL_loss: 58769807768356.805, 
	
10305/191900 (epoch 5) loss: 2.942, gen_loss: 13.150, Ret_loss 2.942, FS_loss 19.801, KL_loss: 58403783032864.945, 
	
10310/191900 (epoch 5) loss: 2.942, gen_loss: 13.149, Ret_loss 2.942, FS_loss 19.804, KL_loss: 57998186151671.242, 
	
10315/191900 (epoch 5) loss: 2.941, gen_loss: 13.152, Ret_loss 2.941, FS_loss 19.812, KL_loss: 63547473697678.203, 
	
10320/191900 (epoch 5) loss: 2.941, gen_loss: 13.153, Ret_loss 2.941, FS_loss 19.818, KL_loss: 63120574823148.781, 
	
10325/191900 (epoch 5) loss: 2.942, gen_loss: 13.155, Ret_loss 2.942, FS_loss 19.826, KL_loss: 62709456536951.242, 
	
10330/191900 (epoch 5) loss: 2.941, gen_loss: 13.156, Ret_loss 2.941, FS_loss 19.831, KL_loss: 62290702409381.391, 
	
10335/191900 (epoch 5) loss: 2.941, gen_loss: 13.158, Ret_loss 2.941, FS_loss 19.837, KL_loss: 62017053400334.680, 
	
10340/191900 (epoch 5) loss: 2.941, gen_loss: 13.158, Ret_loss 2.941, FS_loss 19.842, KL_loss: 61603801463897.055, 
	
10345/191900 (epoch 5) loss: 2.940, gen_loss: 13.160, Ret_loss 2.940, FS_loss 19.847, KL_loss: 61198588439336.391, 
	
10350/191900 (epoch 5) loss: 2.939, gen_loss: 13.160, Ret_loss 2.939, FS_loss 19.852, KL_loss: 61298445477344.680, 
	
10355/191900 (epoch 5) loss: 2.938, gen_loss: 13.159, Ret_loss 2.938, FS_loss 19.853, KL_loss: 60900667548507.672, 
	
10360/191900 (epoch 5) loss: 2.937, gen_loss: 13.161, Ret_loss 2.937, FS_loss 19.859, KL_loss: 60547265509743.453, 
	
10365/191900 (epoch 5) loss: 2.938, gen_loss: 13.162, Ret_loss 2.938, FS_loss 19.865, KL_loss: 60156021903544.445, 
	
10370/191900 (epoch 5) loss: 2.937, gen_loss: 13.163, Ret_loss 2.937, FS_loss 19.872, KL_loss: 59783339903850.719, 
	
10375/191900 (epoch 5) loss: 2.937, gen_loss: 13.164, Ret_loss 2.937, FS_loss 19.876, KL_loss: 59417564961576.812, 
	
10380/191900 (epoch 5) loss: 2.936, gen_loss: 13.167, Ret_loss 2.936, FS_loss 19.882, KL_loss: 59042552908592.695, 
	
10385/191900 (epoch 5) loss: 2.935, gen_loss: 13.167, Ret_loss 2.935, FS_loss 19.887, KL_loss: 58993307363994.539, 
	
10390/191900 (epoch 5) loss: 2.935, gen_loss: 13.168, Ret_loss 2.935, FS_loss 19.892, KL_loss: 58622842106083.539, 
	
10395/191900 (epoch 5) loss: 2.935, gen_loss: 13.170, Ret_loss 2.935, FS_loss 19.900, KL_loss: 129115499931488.516, 
	
10400/191900 (epoch 5) loss: 2.936, gen_loss: 13.173, Ret_loss 2.936, FS_loss 19.907, KL_loss: 128314536935985.781, 
	
10405/191900 (epoch 5) loss: 2.936, gen_loss: 13.173, Ret_loss 2.936, FS_loss 19.913, KL_loss: 127523464227561.672, 
	
10410/191900 (epoch 5) loss: 2.935, gen_loss: 13.173, Ret_loss 2.935, FS_loss 19.917, KL_loss: 126744216014903.453, 
	
10415/191900 (epoch 5) loss: 2.934, gen_loss: 13.174, Ret_loss 2.934, FS_loss 19.922, KL_loss: 125972333293566.984, 
	
10420/191900 (epoch 5) loss: 2.934, gen_loss: 13.176, Ret_loss 2.934, FS_loss 19.929, KL_loss: 125210704170837.766, 
	
10425/191900 (epoch 5) loss: 2.934, gen_loss: 13.177, Ret_loss 2.934, FS_loss 19.934, KL_loss: 124457366270191.281, 
	
10430/191900 (epoch 5) loss: 2.934, gen_loss: 13.178, Ret_loss 2.934, FS_loss 19.939, KL_loss: 123713028788613.438, 
	
10435/191900 (epoch 5) loss: 2.933, gen_loss: 13.180, Ret_loss 2.933, FS_loss 19.947, KL_loss: 122980785339544.125, 
	
10440/191900 (epoch 5) loss: 2.933, gen_loss: 13.182, Ret_loss 2.933, FS_loss 19.953, KL_loss: 122254222054366.031, 
	
10445/191900 (epoch 5) loss: 2.932, gen_loss: 13.183, Ret_loss 2.932, FS_loss 19.959, KL_loss: 121536148713438.234, 
	
10450/191900 (epoch 5) loss: 2.932, gen_loss: 13.185, Ret_loss 2.932, FS_loss 19.965, KL_loss: 120831228557043.969, 
	
10455/191900 (epoch 5) loss: 2.932, gen_loss: 13.184, Ret_loss 2.932, FS_loss 19.967, KL_loss: 120129905920896.672, 
	
10460/191900 (epoch 5) loss: 2.932, gen_loss: 13.187, Ret_loss 2.932, FS_loss 19.975, KL_loss: 119438087650925.891, 
	
10465/191900 (epoch 5) loss: 2.932, gen_loss: 13.188, Ret_loss 2.932, FS_loss 19.980, KL_loss: 119261937623496.078, 
	
10470/191900 (epoch 5) loss: 2.932, gen_loss: 13.189, Ret_loss 2.932, FS_loss 19.984, KL_loss: 118582833123192.328, 
	
10475/191900 (epoch 5) loss: 2.931, gen_loss: 13.189, Ret_loss 2.931, FS_loss 19.987, KL_loss: 117954890736531.828, 
	
10480/191900 (epoch 5) loss: 2.931, gen_loss: 13.189, Ret_loss 2.931, FS_loss 19.991, KL_loss: 117325903611182.734, 
	
10485/191900 (epoch 5) loss: 2.930, gen_loss: 13.190, Ret_loss 2.930, FS_loss 19.996, KL_loss: 116668948882773.266, 
	
10490/191900 (epoch 5) loss: 2.929, gen_loss: 13.190, Ret_loss 2.929, FS_loss 20.001, KL_loss: 116029146560580.500, 
	
10495/191900 (epoch 5) loss: 2.929, gen_loss: 13.190, Ret_loss 2.929, FS_loss 20.003, KL_loss: 115518301985165.703, 
	
10500/191900 (epoch 5) loss: 2.929, gen_loss: 13.190, Ret_loss 2.929, FS_loss 20.007, KL_loss: 114880889531940.094, 
	
10505/191900 (epoch 5) loss: 2.929, gen_loss: 13.190, Ret_loss 2.929, FS_loss 20.009, KL_loss: 114250762521420.078, 
	
10510/191900 (epoch 5) loss: 2.928, gen_loss: 13.191, Ret_loss 2.928, FS_loss 20.014, KL_loss: 113640131208112.562, 
	
10515/191900 (epoch 5) loss: 2.929, gen_loss: 13.194, Ret_loss 2.929, FS_loss 20.022, KL_loss: 113023573750472.609, 
	
10520/191900 (epoch 5) loss: 2.929, gen_loss: 13.194, Ret_loss 2.929, FS_loss 20.026, KL_loss: 112414345450132.109, 
	
10525/191900 (epoch 5) loss: 2.928, gen_loss: 13.195, Ret_loss 2.928, FS_loss 20.031, KL_loss: 111834094971952.328, 
	
10530/191900 (epoch 5) loss: 2.927, gen_loss: 13.196, Ret_loss 2.927, FS_loss 20.034, KL_loss: 111239030499954.797, 
	
10535/191900 (epoch 5) loss: 2.927, gen_loss: 13.197, Ret_loss 2.927, FS_loss 20.039, KL_loss: 110652171343888.250, 
	
10540/191900 (epoch 5) loss: 2.928, gen_loss: 13.198, Ret_loss 2.928, FS_loss 20.043, KL_loss: 323788693797540.438, 
	
10545/191900 (epoch 5) loss: 2.928, gen_loss: 13.198, Ret_loss 2.928, FS_loss 20.045, KL_loss: 322140327057480.062, 
	
10550/191900 (epoch 5) loss: 2.928, gen_loss: 13.198, Ret_loss 2.928, FS_loss 20.048, KL_loss: 320459917620019.375, 
	
10555/191900 (epoch 5) loss: 2.928, gen_loss: 13.199, Ret_loss 2.928, FS_loss 20.053, KL_loss: 318818102878213.250, 
	
10560/191900 (epoch 5) loss: 2.928, gen_loss: 13.200, Ret_loss 2.928, FS_loss 20.057, KL_loss: 317172561428900.750, 
	
10565/191900 (epoch 5) loss: 2.928, gen_loss: 13.201, Ret_loss 2.928, FS_loss 20.060, KL_loss: 315541563766247.125, 
	
10570/191900 (epoch 5) loss: 2.927, gen_loss: 13.201, Ret_loss 2.927, FS_loss 20.064, KL_loss: 313933341240182.500, 
	
10575/191900 (epoch 5) loss: 2.926, gen_loss: 13.202, Ret_loss 2.926, FS_loss 20.069, KL_loss: 312364838355391.750, 
	
10580/191900 (epoch 5) loss: 2.926, gen_loss: 13.203, Ret_loss 2.926, FS_loss 20.074, KL_loss: 310791614487442.875, 
	
10585/191900 (epoch 5) loss: 2.925, gen_loss: 13.205, Ret_loss 2.925, FS_loss 20.081, KL_loss: 309244216075931.438, 
	
10590/191900 (epoch 5) loss: 2.926, gen_loss: 13.207, Ret_loss 2.926, FS_loss 20.088, KL_loss: 308025637507562.375, 
	
10595/191900 (epoch 5) loss: 2.926, gen_loss: 13.208, Ret_loss 2.926, FS_loss 20.093, KL_loss: 306487542312253.062, 
	
10600/191900 (epoch 5) loss: 2.927, gen_loss: 13.207, Ret_loss 2.927, FS_loss 20.095, KL_loss: 304964390458389.312, 
	
10605/191900 (epoch 5) loss: 2.925, gen_loss: 13.208, Ret_loss 2.925, FS_loss 20.099, KL_loss: 303465906476587.000, 
	
10610/191900 (epoch 5) loss: 2.925, gen_loss: 13.209, Ret_loss 2.925, FS_loss 20.101, KL_loss: 301973645622073.375, 
	
10615/191900 (epoch 5) loss: 2.925, gen_loss: 13.210, Ret_loss 2.925, FS_loss 20.106, KL_loss: 300495715445443.000, 
	
10620/191900 (epoch 5) loss: 2.924, gen_loss: 13.210, Ret_loss 2.924, FS_loss 20.110, KL_loss: 299330504880458.312, 
	
10625/191900 (epoch 5) loss: 2.924, gen_loss: 13.210, Ret_loss 2.924, FS_loss 20.112, KL_loss: 297879420115668.000, 
	
10630/191900 (epoch 5) loss: 2.925, gen_loss: 13.210, Ret_loss 2.925, FS_loss 20.115, KL_loss: 296496215603922.500, 
	
10635/191900 (epoch 5) loss: 2.924, gen_loss: 13.211, Ret_loss 2.924, FS_loss 20.121, KL_loss: 295075223949633.625, 
	
10640/191900 (epoch 5) loss: 2.925, gen_loss: 13.212, Ret_loss 2.925, FS_loss 20.125, KL_loss: 293665287725607.125, 
	
10645/191900 (epoch 5) loss: 2.924, gen_loss: 13.211, Ret_loss 2.924, FS_loss 20.127, KL_loss: 292299315862409.062, 
	
10650/191900 (epoch 5) loss: 2.924, gen_loss: 13.212, Ret_loss 2.924, FS_loss 20.131, KL_loss: 290919302044907.562, 
	
10655/191900 (epoch 5) loss: 2.924, gen_loss: 13.212, Ret_loss 2.924, FS_loss 20.136, KL_loss: 289549898364307.375, 
	
10660/191900 (epoch 5) loss: 2.924, gen_loss: 13.214, Ret_loss 2.924, FS_loss 20.140, KL_loss: 288230678242558.500, 
	
10665/191900 (epoch 5) loss: 2.924, gen_loss: 13.214, Ret_loss 2.924, FS_loss 20.144, KL_loss: 286888055879176.062, 
	
10670/191900 (epoch 5) loss: 2.924, gen_loss: 13.214, Ret_loss 2.924, FS_loss 20.148, KL_loss: 285768089677050.250, 
	
10675/191900 (epoch 5) loss: 2.923, gen_loss: 13.215, Ret_loss 2.923, FS_loss 20.150, KL_loss: 284448331964706.750, 
	
10680/191900 (epoch 5) loss: 2.924, gen_loss: 13.215, Ret_loss 2.924, FS_loss 20.153, KL_loss: 283139483289832.812, 
	
10685/191900 (epoch 5) loss: 2.923, gen_loss: 13.214, Ret_loss 2.923, FS_loss 20.156, KL_loss: 281850083813816.125, 
	
10690/191900 (epoch 5) loss: 2.923, gen_loss: 13.215, Ret_loss 2.923, FS_loss 20.160, KL_loss: 303751686141165.000, 
	
10695/191900 (epoch 5) loss: 2.922, gen_loss: 13.216, Ret_loss 2.922, FS_loss 20.165, KL_loss: 302372255959665.438, 
	
10700/191900 (epoch 5) loss: 2.923, gen_loss: 13.217, Ret_loss 2.923, FS_loss 20.170, KL_loss: 301005913942542.125, 
	
10705/191900 (epoch 5) loss: 2.923, gen_loss: 13.217, Ret_loss 2.923, FS_loss 20.172, KL_loss: 299651264405088.062, 
	
10710/191900 (epoch 5) loss: 2.922, gen_loss: 13.217, Ret_loss 2.922, FS_loss 20.179, KL_loss: 298312198963943.438, 
	
10715/191900 (epoch 5) loss: 2.921, gen_loss: 13.218, Ret_loss 2.921, FS_loss 20.184, KL_loss: 296981827174460.500, 
	
10720/191900 (epoch 5) loss: 2.922, gen_loss: 13.219, Ret_loss 2.922, FS_loss 20.188, KL_loss: 295663137224400.500, 
	
10725/191900 (epoch 5) loss: 2.922, gen_loss: 13.219, Ret_loss 2.922, FS_loss 20.194, KL_loss: 294359568620729.812, 
	
10730/191900 (epoch 5) loss: 2.921, gen_loss: 13.220, Ret_loss 2.921, FS_loss 20.200, KL_loss: 293064172384281.438, 
	
10735/191900 (epoch 5) loss: 2.921, gen_loss: 13.220, Ret_loss 2.921, FS_loss 20.204, KL_loss: 291780160591186.562, 
	
10740/191900 (epoch 5) loss: 2.921, gen_loss: 13.221, Ret_loss 2.921, FS_loss 20.210, KL_loss: 290544948101822.562, 
	
10745/191900 (epoch 5) loss: 2.921, gen_loss: 13.220, Ret_loss 2.921, FS_loss 20.211, KL_loss: 289283410976805.562, 
	
10750/191900 (epoch 5) loss: 2.921, gen_loss: 13.221, Ret_loss 2.921, FS_loss 20.218, KL_loss: 288033950249613.938, 
	
10755/191900 (epoch 5) loss: 2.921, gen_loss: 13.220, Ret_loss 2.921, FS_loss 20.220, KL_loss: 298995278732996.438, 
	
10760/191900 (epoch 5) loss: 2.922, gen_loss: 13.221, Ret_loss 2.922, FS_loss 20.225, KL_loss: 297716669160349.875, 
	
10765/191900 (epoch 5) loss: 2.922, gen_loss: 13.221, Ret_loss 2.922, FS_loss 20.230, KL_loss: 296448625056219.938, 
	
10770/191900 (epoch 5) loss: 2.921, gen_loss: 13.221, Ret_loss 2.921, FS_loss 20.234, KL_loss: 295201114228960.875, 
	
10775/191900 (epoch 5) loss: 2.921, gen_loss: 13.221, Ret_loss 2.921, FS_loss 20.238, KL_loss: 294833513186436.875, 
	
10780/191900 (epoch 5) loss: 2.921, gen_loss: 13.220, Ret_loss 2.921, FS_loss 20.240, KL_loss: 293590763254556.250, 
	
10785/191900 (epoch 5) loss: 2.921, gen_loss: 13.220, Ret_loss 2.921, FS_loss 20.245, KL_loss: 292377487570586.562, 
	
10790/191900 (epoch 5) loss: 2.921, gen_loss: 13.221, Ret_loss 2.921, FS_loss 20.250, KL_loss: 291155678648787.688, 
	
10795/191900 (epoch 5) loss: 2.921, gen_loss: 13.220, Ret_loss 2.921, FS_loss 20.253, KL_loss: 289949949392865.500, 
	
10800/191900 (epoch 5) loss: 2.920, gen_loss: 13.221, Ret_loss 2.920, FS_loss 20.259, KL_loss: 288790098836867.375, 
	
10805/191900 (epoch 5) loss: 2.920, gen_loss: 13.221, Ret_loss 2.920, FS_loss 20.262, KL_loss: 287597972781930.562, 
	
10810/191900 (epoch 5) loss: 2.919, gen_loss: 13.221, Ret_loss 2.919, FS_loss 20.265, KL_loss: 287112713279464.625, 
	
10815/191900 (epoch 5) loss: 2.920, gen_loss: 13.221, Ret_loss 2.920, FS_loss 20.268, KL_loss: 285937129618043.062, 
	
10820/191900 (epoch 5) loss: 2.919, gen_loss: 13.221, Ret_loss 2.919, FS_loss 20.274, KL_loss: 284771108367785.375, 
	
10825/191900 (epoch 5) loss: 2.919, gen_loss: 13.221, Ret_loss 2.919, FS_loss 20.278, KL_loss: 283623865920384.125, 
	
10830/191900 (epoch 5) loss: 2.918, gen_loss: 13.222, Ret_loss 2.918, FS_loss 20.283, KL_loss: 282476736035176.625, 
	
10835/191900 (epoch 5) loss: 2.918, gen_loss: 13.222, Ret_loss 2.918, FS_loss 20.286, KL_loss: 281339287530720.656, 
	
10840/191900 (epoch 5) loss: 2.918, gen_loss: 13.222, Ret_loss 2.918, FS_loss 20.290, KL_loss: 280242640746324.438, 
	
10845/191900 (epoch 5) loss: 2.917, gen_loss: 13.222, Ret_loss 2.917, FS_loss 20.295, KL_loss: 279123279061092.875, 
	
10850/191900 (epoch 5) loss: 2.917, gen_loss: 13.222, Ret_loss 2.917, FS_loss 20.297, KL_loss: 278176842514839.031, 
	
10855/191900 (epoch 5) loss: 2.916, gen_loss: 13.222, Ret_loss 2.916, FS_loss 20.301, KL_loss: 277074124385783.688, 
	
10860/191900 (epoch 5) loss: 2.916, gen_loss: 13.223, Ret_loss 2.916, FS_loss 20.308, KL_loss: 275980638338809.312, 
	
10865/191900 (epoch 5) loss: 2.916, gen_loss: 13.224, Ret_loss 2.916, FS_loss 20.312, KL_loss: 274908097268096.500, 
	
10870/191900 (epoch 5) loss: 2.916, gen_loss: 13.224, Ret_loss 2.916, FS_loss 20.316, KL_loss: 273831656259451.781, 
	
10875/191900 (epoch 5) loss: 2.916, gen_loss: 13.225, Ret_loss 2.916, FS_loss 20.319, KL_loss: 272852588791188.688, 
	
10880/191900 (epoch 5) loss: 2.915, gen_loss: 13.225, Ret_loss 2.915, FS_loss 20.322, KL_loss: 271793592191816.250, 
	
10885/191900 (epoch 5) loss: 2.915, gen_loss: 13.225, Ret_loss 2.915, FS_loss 20.326, KL_loss: 270741930301764.625, 
	
10890/191900 (epoch 5) loss: 2.914, gen_loss: 13.225, Ret_loss 2.914, FS_loss 20.329, KL_loss: 269894883925013.531, 
	
10895/191900 (epoch 5) loss: 2.915, gen_loss: 13.226, Ret_loss 2.915, FS_loss 20.334, KL_loss: 268857871416814.500, 
	
10900/191900 (epoch 5) loss: 2.915, gen_loss: 13.227, Ret_loss 2.915, FS_loss 20.338, KL_loss: 267829005879803.500, 
	
10905/191900 (epoch 5) loss: 2.914, gen_loss: 13.226, Ret_loss 2.914, FS_loss 20.340, KL_loss: 266842689063472.219, 
	
10910/191900 (epoch 5) loss: 2.914, gen_loss: 13.226, Ret_loss 2.914, FS_loss 20.343, KL_loss: 265830771313551.375, 
	
10915/191900 (epoch 5) loss: 2.914, gen_loss: 13.227, Ret_loss 2.914, FS_loss 20.347, KL_loss: 264841845323029.719, 
	
10920/191900 (epoch 5) loss: 2.914, gen_loss: 13.228, Ret_loss 2.914, FS_loss 20.352, KL_loss: 263853451886464.781, 
	
10925/191900 (epoch 5) loss: 2.913, gen_loss: 13.228, Ret_loss 2.913, FS_loss 20.356, KL_loss: 262863223029744.031, 
	
10930/191900 (epoch 5) loss: 2.912, gen_loss: 13.228, Ret_loss 2.912, FS_loss 20.360, KL_loss: 261930218143458.312, 
	
10935/191900 (epoch 5) loss: 2.912, gen_loss: 13.229, Ret_loss 2.912, FS_loss 20.363, KL_loss: 260957998215802.750, 
	
10940/191900 (epoch 5) loss: 2.912, gen_loss: 13.229, Ret_loss 2.912, FS_loss 20.367, KL_loss: 260054845544569.156, 
	
10945/191900 (epoch 5) loss: 2.912, gen_loss: 13.229, Ret_loss 2.912, FS_loss 20.370, KL_loss: 259094278035687.375, 
	
10950/191900 (epoch 5) loss: 2.911, gen_loss: 13.230, Ret_loss 2.911, FS_loss 20.374, KL_loss: 258139899879178.750, 
	
10955/191900 (epoch 5) loss: 2.911, gen_loss: 13.229, Ret_loss 2.911, FS_loss 20.377, KL_loss: 257215737988609.312, 
	
10960/191900 (epoch 5) loss: 2.911, gen_loss: 13.229, Ret_loss 2.911, FS_loss 20.380, KL_loss: 256295507952883.812, 
	
10965/191900 (epoch 5) loss: 2.910, gen_loss: 13.229, Ret_loss 2.910, FS_loss 20.382, KL_loss: 255365237955116.625, 
	
10970/191900 (epoch 5) loss: 2.910, gen_loss: 13.229, Ret_loss 2.910, FS_loss 20.386, KL_loss: 254447106543302.875, 
	
10975/191900 (epoch 5) loss: 2.909, gen_loss: 13.229, Ret_loss 2.909, FS_loss 20.389, KL_loss: 253548810076986.938, 
	
10980/191900 (epoch 5) loss: 2.909, gen_loss: 13.229, Ret_loss 2.909, FS_loss 20.393, KL_loss: 252668489155975.031, 
	
10985/191900 (epoch 5) loss: 2.909, gen_loss: 13.229, Ret_loss 2.909, FS_loss 20.395, KL_loss: 251763415155155.656, 
	
10990/191900 (epoch 5) loss: 2.909, gen_loss: 13.228, Ret_loss 2.909, FS_loss 20.399, KL_loss: 250863572109373.062, 
	
10995/191900 (epoch 5) loss: 2.908, gen_loss: 13.228, Ret_loss 2.908, FS_loss 20.402, KL_loss: 249971427436884.062, 
	
11000/191900 (epoch 5) loss: 2.908, gen_loss: 13.229, Ret_loss 2.908, FS_loss 20.405, KL_loss: 249164078407315.312, 
	
11005/191900 (epoch 5) loss: 2.907, gen_loss: 13.228, Ret_loss 2.907, FS_loss 20.408, KL_loss: 248281371081778.969, 
	
11010/191900 (epoch 5) loss: 2.907, gen_loss: 13.229, Ret_loss 2.907, FS_loss 20.413, KL_loss: 247406294468439.688, 
	
11015/191900 (epoch 5) loss: 2.906, gen_loss: 13.230, Ret_loss 2.906, FS_loss 20.417, KL_loss: 246548283941261.250, 
	
11020/191900 (epoch 5) loss: 2.907, gen_loss: 13.230, Ret_loss 2.907, FS_loss 20.419, KL_loss: 245684188142661.844, 
	
11025/191900 (epoch 5) loss: 2.906, gen_loss: 13.231, Ret_loss 2.906, FS_loss 20.425, KL_loss: 245870253158751.531, 
	
11030/191900 (epoch 5) loss: 2.906, gen_loss: 13.231, Ret_loss 2.906, FS_loss 20.427, KL_loss: 245014300631180.656, 
	
11035/191900 (epoch 5) loss: 2.907, gen_loss: 13.231, Ret_loss 2.907, FS_loss 20.431, KL_loss: 244164192892428.625, 
	
11040/191900 (epoch 5) loss: 2.906, gen_loss: 13.232, Ret_loss 2.906, FS_loss 20.435, KL_loss: 244082012716163.188, 
	
11045/191900 (epoch 5) loss: 2.907, gen_loss: 13.232, Ret_loss 2.907, FS_loss 20.439, KL_loss: 243241215249121.656, 
	
11050/191900 (epoch 5) loss: 2.906, gen_loss: 13.233, Ret_loss 2.906, FS_loss 20.444, KL_loss: 242407185062762.375, 
	
11055/191900 (epoch 5) loss: 2.907, gen_loss: 13.234, Ret_loss 2.907, FS_loss 20.448, KL_loss: 241610008991899.062, 
	
11060/191900 (epoch 5) loss: 2.907, gen_loss: 13.235, Ret_loss 2.907, FS_loss 20.453, KL_loss: 240786152654246.781, 
	
11065/191900 (epoch 5) loss: 2.907, gen_loss: 13.236, Ret_loss 2.907, FS_loss 20.457, KL_loss: 239976583329389.125, 
	
11070/191900 (epoch 5) loss: 2.907, gen_loss: 13.236, Ret_loss 2.907, FS_loss 20.460, KL_loss: 239164328049538.594, 
	
11075/191900 (epoch 5) loss: 2.907, gen_loss: 13.236, Ret_loss 2.907, FS_loss 20.463, KL_loss: 238363663259128.906, 
	
11080/191900 (epoch 5) loss: 2.906, gen_loss: 13.237, Ret_loss 2.906, FS_loss 20.467, KL_loss: 237564388017566.312, 
	
11085/191900 (epoch 5) loss: 2.906, gen_loss: 13.236, Ret_loss 2.906, FS_loss 20.470, KL_loss: 236768264207927.469, 
	
11090/191900 (epoch 5) loss: 2.906, gen_loss: 13.237, Ret_loss 2.906, FS_loss 20.474, KL_loss: 236048824005697.188, 
	
11095/191900 (epoch 5) loss: 2.906, gen_loss: 13.239, Ret_loss 2.906, FS_loss 20.481, KL_loss: 235264161529708.125, 
	
11100/191900 (epoch 5) loss: 2.906, gen_loss: 13.238, Ret_loss 2.906, FS_loss 20.482, KL_loss: 234506391095961.844, 
	
11105/191900 (epoch 5) loss: 2.905, gen_loss: 13.238, Ret_loss 2.905, FS_loss 20.486, KL_loss: 233731032106027.531, 
	
11110/191900 (epoch 5) loss: 2.905, gen_loss: 13.239, Ret_loss 2.905, FS_loss 20.489, KL_loss: 232980565971532.500, 
	
11115/191900 (epoch 5) loss: 2.905, gen_loss: 13.239, Ret_loss 2.905, FS_loss 20.493, KL_loss: 232215382299110.906, 
	
11120/191900 (epoch 5) loss: 2.905, gen_loss: 13.238, Ret_loss 2.905, FS_loss 20.495, KL_loss: 231457295501233.656, 
	
11125/191900 (epoch 5) loss: 2.905, gen_loss: 13.238, Ret_loss 2.905, FS_loss 20.499, KL_loss: 230722401664953.938, 
	
11130/191900 (epoch 5) loss: 2.904, gen_loss: 13.239, Ret_loss 2.904, FS_loss 20.502, KL_loss: 229972279636932.844, 
	
11135/191900 (epoch 5) loss: 2.904, gen_loss: 13.239, Ret_loss 2.904, FS_loss 20.505, KL_loss: 229230786863518.156, 
	
11140/191900 (epoch 5) loss: 2.904, gen_loss: 13.239, Ret_loss 2.904, FS_loss 20.509, KL_loss: 228492050888128.594, 
	
11145/191900 (epoch 5) loss: 2.903, gen_loss: 13.239, Ret_loss 2.903, FS_loss 20.512, KL_loss: 227757586586643.969, 
	
11150/191900 (epoch 5) loss: 2.903, gen_loss: 13.239, Ret_loss 2.903, FS_loss 20.515, KL_loss: 227120706134905.250, 
	
11155/191900 (epoch 5) loss: 2.903, gen_loss: 13.239, Ret_loss 2.903, FS_loss 20.517, KL_loss: 226393316228477.938, 
	
11160/191900 (epoch 5) loss: 2.903, gen_loss: 13.240, Ret_loss 2.903, FS_loss 20.521, KL_loss: 225681396294127.156, 
	
11165/191900 (epoch 5) loss: 2.903, gen_loss: 13.240, Ret_loss 2.903, FS_loss 20.524, KL_loss: 224963959187439.875, 
	
11170/191900 (epoch 5) loss: 2.903, gen_loss: 13.240, Ret_loss 2.903, FS_loss 20.526, KL_loss: 224250996457964.031, 
	
11175/191900 (epoch 5) loss: 2.903, gen_loss: 13.240, Ret_loss 2.903, FS_loss 20.529, KL_loss: 226636414312922.906, 
	
11180/191900 (epoch 5) loss: 2.903, gen_loss: 13.240, Ret_loss 2.903, FS_loss 20.532, KL_loss: 225930090373701.906, 
	
11185/191900 (epoch 5) loss: 2.903, gen_loss: 13.240, Ret_loss 2.903, FS_loss 20.535, KL_loss: 225273662590364.062, 
	
11190/191900 (epoch 5) loss: 2.903, gen_loss: 13.241, Ret_loss 2.903, FS_loss 20.539, KL_loss: 224569205364641.844, 
	
11195/191900 (epoch 5) loss: 2.903, gen_loss: 13.240, Ret_loss 2.903, FS_loss 20.541, KL_loss: 223870610838251.844, 
	
11200/191900 (epoch 5) loss: 2.903, gen_loss: 13.240, Ret_loss 2.903, FS_loss 20.544, KL_loss: 223188193268057.094, 
	
11205/191900 (epoch 5) loss: 2.903, gen_loss: 13.240, Ret_loss 2.903, FS_loss 20.548, KL_loss: 222521882818536.625, 
	
11210/191900 (epoch 5) loss: 2.903, gen_loss: 13.241, Ret_loss 2.903, FS_loss 20.552, KL_loss: 221838336844276.125, 
	
11215/191900 (epoch 5) loss: 2.903, gen_loss: 13.239, Ret_loss 2.903, FS_loss 20.552, KL_loss: 221228928831246.219, 
	
11220/191900 (epoch 5) loss: 2.902, gen_loss: 13.239, Ret_loss 2.902, FS_loss 20.554, KL_loss: 220548940633276.469, 
	
11225/191900 (epoch 5) loss: 2.902, gen_loss: 13.239, Ret_loss 2.902, FS_loss 20.558, KL_loss: 219927107912833.500, 
	
11230/191900 (epoch 5) loss: 2.902, gen_loss: 13.240, Ret_loss 2.902, FS_loss 20.562, KL_loss: 219291549020128.250, 
	
11235/191900 (epoch 5) loss: 2.902, gen_loss: 13.240, Ret_loss 2.902, FS_loss 20.565, KL_loss: 218630301192746.906, 
	
11240/191900 (epoch 5) loss: 2.902, gen_loss: 13.241, Ret_loss 2.902, FS_loss 20.569, KL_loss: 217969848050687.531, 
	
11245/191900 (epoch 5) loss: 2.901, gen_loss: 13.241, Ret_loss 2.901, FS_loss 20.572, KL_loss: 217371363329079.969, 
	
11250/191900 (epoch 5) loss: 2.901, gen_loss: 13.242, Ret_loss 2.901, FS_loss 20.576, KL_loss: 216715671186959.625, 
	
11255/191900 (epoch 5) loss: 2.901, gen_loss: 13.242, Ret_loss 2.901, FS_loss 20.579, KL_loss: 217699222490697.812, 
	
11260/191900 (epoch 5) loss: 2.901, gen_loss: 13.242, Ret_loss 2.901, FS_loss 20.582, KL_loss: 217046008019424.188, 
	
11265/191900 (epoch 5) loss: 2.900, gen_loss: 13.242, Ret_loss 2.900, FS_loss 20.585, KL_loss: 216396704201997.781, 
	
11270/191900 (epoch 5) loss: 2.900, gen_loss: 13.242, Ret_loss 2.900, FS_loss 20.589, KL_loss: 215783325435372.000, 
	
11275/191900 (epoch 5) loss: 2.900, gen_loss: 13.242, Ret_loss 2.900, FS_loss 20.593, KL_loss: 215141659810678.469, 
	
11280/191900 (epoch 5) loss: 2.900, gen_loss: 13.243, Ret_loss 2.900, FS_loss 20.595, KL_loss: 214544991801595.000, 
	
11285/191900 (epoch 5) loss: 2.900, gen_loss: 13.243, Ret_loss 2.900, FS_loss 20.599, KL_loss: 213915351863853.875, 
	
11290/191900 (epoch 5) loss: 2.899, gen_loss: 13.244, Ret_loss 2.899, FS_loss 20.603, KL_loss: 213288287411386.719, 
	
11295/191900 (epoch 5) loss: 2.899, gen_loss: 13.244, Ret_loss 2.899, FS_loss 20.606, KL_loss: 213840645278039.906, 
	
11300/191900 (epoch 5) loss: 2.899, gen_loss: 13.244, Ret_loss 2.899, FS_loss 20.607, KL_loss: 213404908157697.062, 
	
11305/191900 (epoch 5) loss: 2.899, gen_loss: 13.243, Ret_loss 2.899, FS_loss 20.608, KL_loss: 212781402701550.656, 
	
11310/191900 (epoch 5) loss: 2.899, gen_loss: 13.243, Ret_loss 2.899, FS_loss 20.611, KL_loss: 212170286557193.094, 
	
11315/191900 (epoch 5) loss: 2.899, gen_loss: 13.244, Ret_loss 2.899, FS_loss 20.616, KL_loss: 211554344818336.500, 
	
11320/191900 (epoch 5) loss: 2.898, gen_loss: 13.244, Ret_loss 2.898, FS_loss 20.619, KL_loss: 210942369028781.375, 
	
11325/191900 (epoch 5) loss: 2.898, gen_loss: 13.245, Ret_loss 2.898, FS_loss 20.622, KL_loss: 210374126168864.531, 
	
11330/191900 (epoch 5) loss: 2.898, gen_loss: 13.245, Ret_loss 2.898, FS_loss 20.625, KL_loss: 209770311133301.531, 
	
11335/191900 (epoch 5) loss: 2.898, gen_loss: 13.246, Ret_loss 2.898, FS_loss 20.629, KL_loss: 209271111123202.344, 
	
11340/191900 (epoch 5) loss: 2.898, gen_loss: 13.247, Ret_loss 2.898, FS_loss 20.632, KL_loss: 208695155543603.750, 
	
11345/191900 (epoch 5) loss: 2.897, gen_loss: 13.248, Ret_loss 2.897, FS_loss 20.636, KL_loss: 208100539386769.031, 
	
11350/191900 (epoch 5) loss: 2.897, gen_loss: 13.247, Ret_loss 2.897, FS_loss 20.638, KL_loss: 207511154738023.938, 
	
11355/191900 (epoch 5) loss: 2.898, gen_loss: 13.246, Ret_loss 2.898, FS_loss 20.640, KL_loss: 206949836776856.344, 
	
11360/191900 (epoch 5) loss: 2.897, gen_loss: 13.247, Ret_loss 2.897, FS_loss 20.642, KL_loss: 206366150948068.031, 
	
11365/191900 (epoch 5) loss: 2.897, gen_loss: 13.247, Ret_loss 2.897, FS_loss 20.646, KL_loss: 206461282119515.344, 
	
11370/191900 (epoch 5) loss: 2.897, gen_loss: 13.248, Ret_loss 2.897, FS_loss 20.649, KL_loss: 205880828807158.344, 
	
11375/191900 (epoch 5) loss: 2.897, gen_loss: 13.248, Ret_loss 2.897, FS_loss 20.651, KL_loss: 205305204747802.312, 
	
11380/191900 (epoch 5) loss: 2.897, gen_loss: 13.248, Ret_loss 2.897, FS_loss 20.654, KL_loss: 204738816792747.562, 
	
11385/191900 (epoch 5) loss: 2.897, gen_loss: 13.248, Ret_loss 2.897, FS_loss 20.656, KL_loss: 204167961274254.375, 
	
11390/191900 (epoch 5) loss: 2.896, gen_loss: 13.248, Ret_loss 2.896, FS_loss 20.659, KL_loss: 208977164135179.625, 
	
11395/191900 (epoch 5) loss: 2.896, gen_loss: 13.249, Ret_loss 2.896, FS_loss 20.662, KL_loss: 208396997363644.375, 
	
11400/191900 (epoch 5) loss: 2.896, gen_loss: 13.249, Ret_loss 2.896, FS_loss 20.666, KL_loss: 207822730775784.781, 
	
11405/191900 (epoch 5) loss: 2.896, gen_loss: 13.249, Ret_loss 2.896, FS_loss 20.668, KL_loss: 207248959051874.000, 
	
11410/191900 (epoch 5) loss: 2.895, gen_loss: 13.249, Ret_loss 2.895, FS_loss 20.671, KL_loss: 206678663261459.500, 
	
11415/191900 (epoch 5) loss: 2.895, gen_loss: 13.249, Ret_loss 2.895, FS_loss 20.674, KL_loss: 206111245452684.469, 
	
11420/191900 (epoch 5) loss: 2.895, gen_loss: 13.249, Ret_loss 2.895, FS_loss 20.676, KL_loss: 205546956117899.656, 
	
11425/191900 (epoch 5) loss: 2.894, gen_loss: 13.250, Ret_loss 2.894, FS_loss 20.680, KL_loss: 204987827317818.469, 
	
11430/191900 (epoch 5) loss: 2.894, gen_loss: 13.251, Ret_loss 2.894, FS_loss 20.684, KL_loss: 204429627816741.688, 
	
11435/191900 (epoch 5) loss: 2.894, gen_loss: 13.252, Ret_loss 2.894, FS_loss 20.689, KL_loss: 203878798890330.844, 
	
11440/191900 (epoch 5) loss: 2.894, gen_loss: 13.253, Ret_loss 2.894, FS_loss 20.692, KL_loss: 203326650099733.406, 
	
11445/191900 (epoch 5) loss: 2.894, gen_loss: 13.253, Ret_loss 2.894, FS_loss 20.695, KL_loss: 202783298593486.375, 
	
11450/191900 (epoch 5) loss: 2.894, gen_loss: 13.253, Ret_loss 2.894, FS_loss 20.698, KL_loss: 202238017014489.688, 
	
11455/191900 (epoch 5) loss: 2.894, gen_loss: 13.254, Ret_loss 2.894, FS_loss 20.701, KL_loss: 201695043270803.781, 
	
11460/191900 (epoch 5) loss: 2.894, gen_loss: 13.253, Ret_loss 2.894, FS_loss 20.702, KL_loss: 201205846822180.250, 
	
11465/191900 (epoch 5) loss: 2.894, gen_loss: 13.253, Ret_loss 2.894, FS_loss 20.706, KL_loss: 200694390329391.375, 
	
11470/191900 (epoch 5) loss: 2.894, gen_loss: 13.253, Ret_loss 2.894, FS_loss 20.708, KL_loss: 200160412742218.531, 
	
11475/191900 (epoch 5) loss: 2.894, gen_loss: 13.254, Ret_loss 2.894, FS_loss 20.711, KL_loss: 199671554165886.062, 
	
11480/191900 (epoch 5) loss: 2.894, gen_loss: 13.254, Ret_loss 2.894, FS_loss 20.714, KL_loss: 199206054413227.594, 
	
11485/191900 (epoch 5) loss: 2.894, gen_loss: 13.255, Ret_loss 2.894, FS_loss 20.717, KL_loss: 198681731513009.094, 
	
11490/191900 (epoch 5) loss: 2.894, gen_loss: 13.256, Ret_loss 2.894, FS_loss 20.721, KL_loss: 199711613232729.969, 
	
11495/191900 (epoch 5) loss: 2.894, gen_loss: 13.257, Ret_loss 2.894, FS_loss 20.725, KL_loss: 199239968902477.750, 
	
11500/191900 (epoch 5) loss: 2.893, gen_loss: 13.257, Ret_loss 2.893, FS_loss 20.727, KL_loss: 198721282419349.125, 
	
11505/191900 (epoch 5) loss: 2.893, gen_loss: 13.258, Ret_loss 2.893, FS_loss 20.730, KL_loss: 198212633556675.094, 
	
11510/191900 (epoch 5) loss: 2.894, gen_loss: 13.258, Ret_loss 2.894, FS_loss 20.732, KL_loss: 202645406202434.562, 
	
11515/191900 (epoch 6) loss: 2.809, gen_loss: 13.418, Ret_loss 2.809, FS_loss 22.020, KL_loss: 11065663160320.000, 
	
11520/191900 (epoch 6) loss: 2.813, gen_loss: 13.539, Ret_loss 2.813, FS_loss 22.081, KL_loss: 1203912273931995.500, 
	
11525/191900 (epoch 6) loss: 2.838, gen_loss: 13.505, Ret_loss 2.838, FS_loss 22.068, KL_loss: 702283886413504.000, 
	
11530/191900 (epoch 6) loss: 2.798, gen_loss: 13.509, Ret_loss 2.798, FS_loss 22.046, KL_loss: 495741513406825.438, 
	
11535/191900 (epoch 6) loss: 2.786, gen_loss: 13.469, Ret_loss 2.786, FS_loss 22.007, KL_loss: 383226738600354.938, 
	
11540/191900 (epoch 6) loss: 2.798, gen_loss: 13.496, Ret_loss 2.798, FS_loss 22.041, KL_loss: 312261199976523.875, 
	
11545/191900 (epoch 6) loss: 2.821, gen_loss: 13.492, Ret_loss 2.821, FS_loss 22.020, KL_loss: 264096249267584.000, 
	
11550/191900 (epoch 6) loss: 2.795, gen_loss: 13.490, Ret_loss 2.795, FS_loss 22.045, KL_loss: 228413872882494.281, 
	
11555/191900 (epoch 6) loss: 2.805, gen_loss: 13.494, Ret_loss 2.805, FS_loss 22.017, KL_loss: 201253271935317.344, 
	
11560/191900 (epoch 6) loss: 2.829, gen_loss: 13.499, Ret_loss 2.829, FS_loss 22.047, KL_loss: 180566443485619.750, 
	
11565/191900 (epoch 6) loss: 2.822, gen_loss: 13.505, Ret_loss 2.822, FS_loss 22.056, KL_loss: 163220968051830.156, 
	
11570/191900 (epoch 6) loss: 2.822, gen_loss: 13.494, Ret_loss 2.822, FS_loss 22.052, KL_loss: 149647166539057.406, 
	
11575/191900 (epoch 6) loss: 2.817, gen_loss: 13.491, Ret_loss 2.817, FS_loss 22.055, KL_loss: 137695695964391.219, 
	
11580/191900 (epoch 6) loss: 2.809, gen_loss: 13.485, Ret_loss 2.809, FS_loss 22.047, KL_loss: 128125841265832.125, 
	
11585/191900 (epoch 6) loss: 2.807, gen_loss: 13.499, Ret_loss 2.807, FS_loss 22.073, KL_loss: 119277698523278.219, 
	
11590/191900 (epoch 6) loss: 2.822, gen_loss: 13.487, Ret_loss 2.822, FS_loss 22.050, KL_loss: 112033632545938.281, 
	
11595/191900 (epoch 6) loss: 2.823, gen_loss: 13.479, Ret_loss 2.823, FS_loss 22.024, KL_loss: 105217820475516.875, 
	
11600/191900 (epoch 6) loss: 2.823, gen_loss: 13.471, Ret_loss 2.823, FS_loss 22.010, KL_loss: 99200078260271.078, 
	
11605/191900 (epoch 6) loss: 2.821, gen_loss: 13.473, Ret_loss 2.821, FS_loss 22.006, KL_loss: 116451345681363.484, 
	
11610/191900 (epoch 6) loss: 2.817, gen_loss: 13.475, Ret_loss 2.817, FS_loss 22.009, KL_loss: 110448883983191.094, 
	
11615/191900 (epoch 6) loss: 2.819, gen_loss: 13.454, Ret_loss 2.819, FS_loss 21.977, KL_loss: 105035858220016.938, 
	
11620/191900 (epoch 6) loss: 2.817, gen_loss: 13.454, Ret_loss 2.817, FS_loss 21.974, KL_loss: 100148871717586.547, 
	
11625/191900 (epoch 6) loss: 2.818, gen_loss: 13.455, Ret_loss 2.818, FS_loss 21.973, KL_loss: 95678458656178.281, 
	
11630/191900 (epoch 6) loss: 2.819, gen_loss: 13.452, Ret_loss 2.819, FS_loss 21.966, KL_loss: 91622908543391.719, 
	
11635/191900 (epoch 6) loss: 2.822, gen_loss: 13.451, Ret_loss 2.822, FS_loss 21.967, KL_loss: 87872122680500.453, 
	
11640/191900 (epoch 6) loss: 2.817, gen_loss: 13.462, Ret_loss 2.817, FS_loss 21.993, KL_loss: 84421335969433.203, 
	
11645/191900 (epoch 6) loss: 2.823, gen_loss: 13.453, Ret_loss 2.823, FS_loss 21.976, KL_loss: 131304602325791.031, 
	
11650/191900 (epoch 6) loss: 2.823, gen_loss: 13.435, Ret_loss 2.823, FS_loss 21.953, KL_loss: 126512577546512.812, 
	
11655/191900 (epoch 6) loss: 2.821, gen_loss: 13.434, Ret_loss 2.821, FS_loss 21.953, KL_loss: 122106786682234.594, 
	
11660/191900 (epoch 6) loss: 2.818, gen_loss: 13.425, Ret_loss 2.818, FS_loss 21.935, KL_loss: 117954641247214.578, 
	
11665/191900 (epoch 6) loss: 2.816, gen_loss: 13.432, Ret_loss 2.816, FS_loss 21.948, KL_loss: 114075304914940.625, 
	
11670/191900 (epoch 6) loss: 2.817, gen_loss: 13.442, Ret_loss 2.817, FS_loss 21.961, KL_loss: 111095704120427.625, 
	
11675/191900 (epoch 6) loss: 2.821, gen_loss: 13.448, Ret_loss 2.821, FS_loss 21.965, KL_loss: 107669262639555.953, 
	
11680/191900 (epoch 6) loss: 2.818, gen_loss: 13.449, Ret_loss 2.818, FS_loss 21.964, KL_loss: 104778346967895.375, 
	
11685/191900 (epoch 6) loss: 2.817, gen_loss: 13.448, Ret_loss 2.817, FS_loss 21.961, KL_loss: 101736353673498.797, 
	
11690/191900 (epoch 6) loss: 2.813, gen_loss: 13.448, Ret_loss 2.813, FS_loss 21.962, KL_loss: 98868222691313.531, 
	
11695/191900 (epoch 6) loss: 2.814, gen_loss: 13.456, Ret_loss 2.814, FS_loss 21.976, KL_loss: 96625857619087.469, 
	
11700/191900 (epoch 6) loss: 2.810, gen_loss: 13.459, Ret_loss 2.810, FS_loss 21.986, KL_loss: 94053806293777.797, 
	
11705/191900 (epoch 6) loss: 2.812, gen_loss: 13.461, Ret_loss 2.812, FS_loss 21.987, KL_loss: 91655567501053.328, 
	
11710/191900 (epoch 6) loss: 2.808, gen_loss: 13.464, Ret_loss 2.808, FS_loss 21.995, KL_loss: 251819291974197.594, 
	
11715/191900 (epoch 6) loss: 2.810, gen_loss: 13.466, Ret_loss 2.810, FS_loss 21.998, KL_loss: 245586170290686.094, 
	
11720/191900 (epoch 6) loss: 2.809, gen_loss: 13.472, Ret_loss 2.809, FS_loss 22.011, KL_loss: 239685725959579.219, 
	
11725/191900 (epoch 6) loss: 2.809, gen_loss: 13.476, Ret_loss 2.809, FS_loss 22.014, KL_loss: 234032822706561.219, 
	
11730/191900 (epoch 6) loss: 2.811, gen_loss: 13.473, Ret_loss 2.811, FS_loss 22.006, KL_loss: 228641341551063.875, 
	
11735/191900 (epoch 6) loss: 2.809, gen_loss: 13.468, Ret_loss 2.809, FS_loss 22.000, KL_loss: 223493632948992.000, 
	
11740/191900 (epoch 6) loss: 2.809, gen_loss: 13.468, Ret_loss 2.809, FS_loss 22.000, KL_loss: 218571067757743.938, 
	
11745/191900 (epoch 6) loss: 2.807, gen_loss: 13.466, Ret_loss 2.807, FS_loss 21.994, KL_loss: 213884238113774.344, 
	
11750/191900 (epoch 6) loss: 2.809, gen_loss: 13.467, Ret_loss 2.809, FS_loss 21.995, KL_loss: 209372699967894.156, 
	
11755/191900 (epoch 6) loss: 2.808, gen_loss: 13.467, Ret_loss 2.808, FS_loss 22.001, KL_loss: 205048288768287.750, 
	
11760/191900 (epoch 6) loss: 2.805, gen_loss: 13.467, Ret_loss 2.805, FS_loss 22.003, KL_loss: 201098029053396.469, 
	
11765/191900 (epoch 6) loss: 2.806, gen_loss: 13.467, Ret_loss 2.806, FS_loss 21.999, KL_loss: 197109681569580.688, 
	
11770/191900 (epoch 6) loss: 2.806, gen_loss: 13.469, Ret_loss 2.806, FS_loss 22.003, KL_loss: 193283465160966.969, 
	
11775/191900 (epoch 6) loss: 2.806, gen_loss: 13.472, Ret_loss 2.806, FS_loss 22.005, KL_loss: 194574305023531.000, 
	
11780/191900 (epoch 6) loss: 2.810, gen_loss: 13.466, Ret_loss 2.810, FS_loss 21.993, KL_loss: 190937695289021.844, 
	
11785/191900 (epoch 6) loss: 2.812, gen_loss: 13.466, Ret_loss 2.812, FS_loss 21.988, KL_loss: 187443418776079.062, 
	
11790/191900 (epoch 6) loss: 2.812, gen_loss: 13.470, Ret_loss 2.812, FS_loss 21.989, KL_loss: 185058224495885.875, 
	
11795/191900 (epoch 6) loss: 2.810, gen_loss: 13.471, Ret_loss 2.810, FS_loss 21.992, KL_loss: 181931262318766.312, 
	
11800/191900 (epoch 6) loss: 2.811, gen_loss: 13.470, Ret_loss 2.811, FS_loss 21.990, KL_loss: 178765319294604.938, 
	
11805/191900 (epoch 6) loss: 2.810, gen_loss: 13.471, Ret_loss 2.810, FS_loss 21.988, KL_loss: 175711204091525.250, 
	
11810/191900 (epoch 6) loss: 2.811, gen_loss: 13.471, Ret_loss 2.811, FS_loss 21.983, KL_loss: 173579856039191.281, 
	
11815/191900 (epoch 6) loss: 2.814, gen_loss: 13.469, Ret_loss 2.814, FS_loss 21.972, KL_loss: 170709268391203.594, 
	
11820/191900 (epoch 6) loss: 2.814, gen_loss: 13.467, Ret_loss 2.814, FS_loss 21.970, KL_loss: 167938946287502.594, 
	
11825/191900 (epoch 6) loss: 2.813, gen_loss: 13.468, Ret_loss 2.813, FS_loss 21.967, KL_loss: 165458940309674.656, 
	
11830/191900 (epoch 6) loss: 2.814, gen_loss: 13.469, Ret_loss 2.814, FS_loss 21.965, KL_loss: 162859234806205.781, 
	
11835/191900 (epoch 6) loss: 2.812, gen_loss: 13.470, Ret_loss 2.812, FS_loss 21.966, KL_loss: 160338175188597.656, 
	
11840/191900 (epoch 6) loss: 2.811, gen_loss: 13.471, Ret_loss 2.811, FS_loss 21.964, KL_loss: 157957760142182.562, 
	
11845/191900 (epoch 6) loss: 2.811, gen_loss: 13.474, Ret_loss 2.811, FS_loss 21.969, KL_loss: 158001793175366.938, 
	
11850/191900 (epoch 6) loss: 2.813, gen_loss: 13.472, Ret_loss 2.813, FS_loss 21.964, KL_loss: 162843539717894.844, 
	
11855/191900 (epoch 6) loss: 2.814, gen_loss: 13.473, Ret_loss 2.814, FS_loss 21.964, KL_loss: 160462942289747.844, 
	
11860/191900 (epoch 6) loss: 2.816, gen_loss: 13.479, Ret_loss 2.816, FS_loss 21.970, KL_loss: 158159797294261.500, 
	
11865/191900 (epoch 6) loss: 2.815, gen_loss: 13.479, Ret_loss 2.815, FS_loss 21.966, KL_loss: 155914222443184.000, 
	
11870/191900 (epoch 6) loss: 2.816, gen_loss: 13.482, Ret_loss 2.816, FS_loss 21.969, KL_loss: 153731415837287.250, 
	
11875/191900 (epoch 6) loss: 2.816, gen_loss: 13.479, Ret_loss 2.816, FS_loss 21.960, KL_loss: 151647217008234.062, 
	
11880/191900 (epoch 6) loss: 2.816, gen_loss: 13.475, Ret_loss 2.816, FS_loss 21.949, KL_loss: 149583657990273.750, 
	
11885/191900 (epoch 6) loss: 2.816, gen_loss: 13.477, Ret_loss 2.816, FS_loss 21.949, KL_loss: 147632247062265.125, 
	
11890/191900 (epoch 6) loss: 2.816, gen_loss: 13.480, Ret_loss 2.816, FS_loss 21.950, KL_loss: 146282011705323.625, 
	
11895/191900 (epoch 6) loss: 2.815, gen_loss: 13.481, Ret_loss 2.815, FS_loss 21.949, KL_loss: 144367852767865.969, 
	
11900/191900 (epoch 6) loss: 2.816, gen_loss: 13.483, Ret_loss 2.816, FS_loss 21.950, KL_loss: 142631013387527.281, 
	
11905/191900 (epoch 6) loss: 2.815, gen_loss: 13.481, Ret_loss 2.815, FS_loss 21.947, KL_loss: 140817985212553.156, 
	
11910/191900 (epoch 6) loss: 2.817, gen_loss: 13.481, Ret_loss 2.817, FS_loss 21.944, KL_loss: 139046692962129.891, 
	
11915/191900 (epoch 6) loss: 2.817, gen_loss: 13.483, Ret_loss 2.817, FS_loss 21.945, KL_loss: 137409405394119.953, 
	
11920/191900 (epoch 6) loss: 2.816, gen_loss: 13.484, Ret_loss 2.816, FS_loss 21.942, KL_loss: 135724712846168.688, 
	
11925/191900 (epoch 6) loss: 2.818, gen_loss: 13.486, Ret_loss 2.818, FS_loss 21.945, KL_loss: 134584640836489.938, 
	
11930/191900 (epoch 6) loss: 2.820, gen_loss: 13.486, Ret_loss 2.820, FS_loss 21.941, KL_loss: 132972713144733.781, 
	
11935/191900 (epoch 6) loss: 2.820, gen_loss: 13.492, Ret_loss 2.820, FS_loss 21.949, KL_loss: 131399022652072.641, 
	
11940/191900 (epoch 6) loss: 2.819, gen_loss: 13.495, Ret_loss 2.819, FS_loss 21.953, KL_loss: 129916143133814.703, 
	
11945/191900 (epoch 6) loss: 2.818, gen_loss: 13.496, Ret_loss 2.818, FS_loss 21.951, KL_loss: 128414176000541.625, 
	
11950/191900 (epoch 6) loss: 2.817, gen_loss: 13.495, Ret_loss 2.817, FS_loss 21.947, KL_loss: 126969645860138.766, 
	
11955/191900 (epoch 6) loss: 2.816, gen_loss: 13.497, Ret_loss 2.816, FS_loss 21.951, KL_loss: 125561673312664.906, 
	
11960/191900 (epoch 6) loss: 2.816, gen_loss: 13.499, Ret_loss 2.816, FS_loss 21.951, KL_loss: 124170024678513.391, 
	
11965/191900 (epoch 6) loss: 2.817, gen_loss: 13.502, Ret_loss 2.817, FS_loss 21.954, KL_loss: 122808682322492.031, 
	
11970/191900 (epoch 6) loss: 2.817, gen_loss: 13.504, Ret_loss 2.817, FS_loss 21.957, KL_loss: 121556008188026.125, 
	
11975/191900 (epoch 6) loss: 2.817, gen_loss: 13.505, Ret_loss 2.817, FS_loss 21.956, KL_loss: 120243833421621.188, 
	
11980/191900 (epoch 6) loss: 2.817, gen_loss: 13.505, Ret_loss 2.817, FS_loss 21.952, KL_loss: 119033414402864.781, 
	
11985/191900 (epoch 6) loss: 2.816, gen_loss: 13.505, Ret_loss 2.816, FS_loss 21.949, KL_loss: 117820558949854.375, 
	
11990/191900 (epoch 6) loss: 2.815, gen_loss: 13.508, Ret_loss 2.815, FS_loss 21.952, KL_loss: 116596453374223.562, 
	
11995/191900 (epoch 6) loss: 2.816, gen_loss: 13.510, Ret_loss 2.816, FS_loss 21.955, KL_loss: 115518350837353.156, 
	
12000/191900 (epoch 6) loss: 2.815, gen_loss: 13.511, Ret_loss 2.815, FS_loss 21.953, KL_loss: 114338662710632.609, 
	
12005/191900 (epoch 6) loss: 2.814, gen_loss: 13.511, Ret_loss 2.814, FS_loss 21.951, KL_loss: 113891697590414.562, 
	
12010/191900 (epoch 6) loss: 2.815, gen_loss: 13.510, Ret_loss 2.815, FS_loss 21.947, KL_loss: 114689126650780.078, 
	
12015/191900 (epoch 6) loss: 2.815, gen_loss: 13.511, Ret_loss 2.815, FS_loss 21.948, KL_loss: 113547821729499.281, 
	
12020/191900 (epoch 6) loss: 2.815, gen_loss: 13.511, Ret_loss 2.815, FS_loss 21.947, KL_loss: 112456268300054.719, 
	
12025/191900 (epoch 6) loss: 2.816, gen_loss: 13.514, Ret_loss 2.816, FS_loss 21.951, KL_loss: 111360254977241.000, 
	
12030/191900 (epoch 6) loss: 2.815, gen_loss: 13.514, Ret_loss 2.815, FS_loss 21.953, KL_loss: 110287652441732.703, 
	
12035/191900 (epoch 6) loss: 2.813, gen_loss: 13.515, Ret_loss 2.813, FS_loss 21.953, KL_loss: 109337813990836.469, 
	
12040/191900 (epoch 6) loss: 2.813, gen_loss: 13.516, Ret_loss 2.813, FS_loss 21.953, KL_loss: 108302655662061.547, 
	
12045/191900 (epoch 6) loss: 2.814, gen_loss: 13.519, Ret_loss 2.814, FS_loss 21.958, KL_loss: 107333842314964.688, 
	
12050/191900 (epoch 6) loss: 2.813, gen_loss: 13.518, Ret_loss 2.813, FS_loss 21.957, KL_loss: 106336386182131.609, 
	
12055/191900 (epoch 6) loss: 2.814, gen_loss: 13.519, Ret_loss 2.814, FS_loss 21.955, KL_loss: 105377058364979.953, 
	
12060/191900 (epoch 6) loss: 2.813, gen_loss: 13.521, Ret_loss 2.813, FS_loss 21.959, KL_loss: 105079126481072.906, 
	
12065/191900 (epoch 6) loss: 2.813, gen_loss: 13.524, Ret_loss 2.813, FS_loss 21.961, KL_loss: 104127766931909.562, 
	
12070/191900 (epoch 6) loss: 2.813, gen_loss: 13.525, Ret_loss 2.813, FS_loss 21.959, KL_loss: 106462992049004.000, 
	
12075/191900 (epoch 6) loss: 2.813, gen_loss: 13.527, Ret_loss 2.813, FS_loss 21.961, KL_loss: 105516851567890.219, 
	
12080/191900 (epoch 6) loss: 2.815, gen_loss: 13.527, Ret_loss 2.815, FS_loss 21.960, KL_loss: 104731442832076.078, 
	
12085/191900 (epoch 6) loss: 2.814, gen_loss: 13.527, Ret_loss 2.814, FS_loss 21.961, KL_loss: 103819807902004.812, 
	
12090/191900 (epoch 6) loss: 2.815, gen_loss: 13.529, Ret_loss 2.815, FS_loss 21.959, KL_loss: 102922711148960.172, 
	
12095/191900 (epoch 6) loss: 2.814, gen_loss: 13.530, Ret_loss 2.814, FS_loss 21.960, KL_loss: 102167963388425.672, 
	
12100/191900 (epoch 6) loss: 2.813, gen_loss: 13.532, Ret_loss 2.813, FS_loss 21.962, KL_loss: 101299606676817.547, 
	
12105/191900 (epoch 6) loss: 2.814, gen_loss: 13.533, Ret_loss 2.814, FS_loss 21.964, KL_loss: 144348135947347.906, 
	
12110/191900 (epoch 6) loss: 2.815, gen_loss: 13.535, Ret_loss 2.815, FS_loss 21.965, KL_loss: 143139200185915.812, 
	
12115/191900 (epoch 6) loss: 2.815, gen_loss: 13.537, Ret_loss 2.815, FS_loss 21.968, KL_loss: 141950353572108.125, 
	
12120/191900 (epoch 6) loss: 2.816, gen_loss: 13.539, Ret_loss 2.816, FS_loss 21.971, KL_loss: 140783335740354.625, 
	
12125/191900 (epoch 6) loss: 2.816, gen_loss: 13.537, Ret_loss 2.816, FS_loss 21.967, KL_loss: 139633183131814.281, 
	
12130/191900 (epoch 6) loss: 2.815, gen_loss: 13.537, Ret_loss 2.815, FS_loss 21.966, KL_loss: 138504688121619.297, 
	
12135/191900 (epoch 6) loss: 2.814, gen_loss: 13.539, Ret_loss 2.814, FS_loss 21.970, KL_loss: 137391510441829.859, 
	
12140/191900 (epoch 6) loss: 2.814, gen_loss: 13.541, Ret_loss 2.814, FS_loss 21.971, KL_loss: 136296315353460.969, 
	
12145/191900 (epoch 6) loss: 2.813, gen_loss: 13.543, Ret_loss 2.813, FS_loss 21.972, KL_loss: 135242753932635.344, 
	
12150/191900 (epoch 6) loss: 2.815, gen_loss: 13.544, Ret_loss 2.815, FS_loss 21.971, KL_loss: 134182102445839.469, 
	
12155/191900 (epoch 6) loss: 2.817, gen_loss: 13.545, Ret_loss 2.817, FS_loss 21.972, KL_loss: 133150823501719.328, 
	
12160/191900 (epoch 6) loss: 2.818, gen_loss: 13.544, Ret_loss 2.818, FS_loss 21.971, KL_loss: 132123604970206.969, 
	
12165/191900 (epoch 6) loss: 2.816, gen_loss: 13.546, Ret_loss 2.816, FS_loss 21.971, KL_loss: 131125872175428.125, 
	
12170/191900 (epoch 6) loss: 2.816, gen_loss: 13.549, Ret_loss 2.816, FS_loss 21.974, KL_loss: 130437958650236.875, 
	
12175/191900 (epoch 6) loss: 2.816, gen_loss: 13.549, Ret_loss 2.816, FS_loss 21.970, KL_loss: 129478293496832.578, 
	
12180/191900 (epoch 6) loss: 2.816, gen_loss: 13.553, Ret_loss 2.816, FS_loss 21.975, KL_loss: 128540408596185.812, 
	
12185/191900 (epoch 6) loss: 2.816, gen_loss: 13.553, Ret_loss 2.816, FS_loss 21.973, KL_loss: 127587493715538.859, 
	
12190/191900 (epoch 6) loss: 2.816, gen_loss: 13.556, Ret_loss 2.816, FS_loss 21.976, KL_loss: 129168839398786.266, 
	
12195/191900 (epoch 6) loss: 2.815, gen_loss: 13.558, Ret_loss 2.815, FS_loss 21.978, KL_loss: 128221931037843.703, 
	
12200/191900 (epoch 6) loss: 2.816, gen_loss: 13.559, Ret_loss 2.816, FS_loss 21.978, KL_loss: 127339330885157.078, 
	
12205/191900 (epoch 6) loss: 2.814, gen_loss: 13.561, Ret_loss 2.814, FS_loss 21.980, KL_loss: 126420070274638.984, 
	
12210/191900 (epoch 6) loss: 2.815, gen_loss: 13.562, Ret_loss 2.815, FS_loss 21.977, KL_loss: 125513617792394.281, 
	
12215/191900 (epoch 6) loss: 2.815, gen_loss: 13.564, Ret_loss 2.815, FS_loss 21.978, KL_loss: 124630324339988.234, 
	
12220/191900 (epoch 6) loss: 2.815, gen_loss: 13.565, Ret_loss 2.815, FS_loss 21.977, KL_loss: 123749522639852.266, 
	
12225/191900 (epoch 6) loss: 2.815, gen_loss: 13.566, Ret_loss 2.815, FS_loss 21.975, KL_loss: 122933641689622.109, 
	
12230/191900 (epoch 6) loss: 2.815, gen_loss: 13.568, Ret_loss 2.815, FS_loss 21.977, KL_loss: 122090414170082.547, 
	
12235/191900 (epoch 6) loss: 2.814, gen_loss: 13.568, Ret_loss 2.814, FS_loss 21.974, KL_loss: 121247145398492.359, 
	
12240/191900 (epoch 6) loss: 2.815, gen_loss: 13.571, Ret_loss 2.815, FS_loss 21.975, KL_loss: 120443861576081.953, 
	
12245/191900 (epoch 6) loss: 2.815, gen_loss: 13.572, Ret_loss 2.815, FS_loss 21.976, KL_loss: 119903339567813.766, 
	
12250/191900 (epoch 6) loss: 2.816, gen_loss: 13.575, Ret_loss 2.816, FS_loss 21.977, KL_loss: 119090576280026.312, 
	
12255/191900 (epoch 6) loss: 2.815, gen_loss: 13.575, Ret_loss 2.815, FS_loss 21.975, KL_loss: 118304017568913.422, 
	
12260/191900 (epoch 6) loss: 2.815, gen_loss: 13.576, Ret_loss 2.815, FS_loss 21.973, KL_loss: 117513046324421.906, 
	
12265/191900 (epoch 6) loss: 2.815, gen_loss: 13.579, Ret_loss 2.815, FS_loss 21.974, KL_loss: 116734218693761.875, 
	
12270/191900 (epoch 6) loss: 2.816, gen_loss: 13.580, Ret_loss 2.816, FS_loss 21.974, KL_loss: 116012569418357.516, 
	
12275/191900 (epoch 6) loss: 2.816, gen_loss: 13.580, Ret_loss 2.816, FS_loss 21.974, KL_loss: 115252186495679.328, 
	
12280/191900 (epoch 6) loss: 2.815, gen_loss: 13.580, Ret_loss 2.815, FS_loss 21.971, KL_loss: 116944760755408.766, 
	
12285/191900 (epoch 6) loss: 2.815, gen_loss: 13.581, Ret_loss 2.815, FS_loss 21.969, KL_loss: 116205905878497.984, 
	
12290/191900 (epoch 6) loss: 2.814, gen_loss: 13.583, Ret_loss 2.814, FS_loss 21.970, KL_loss: 115573336047119.656, 
	
12295/191900 (epoch 6) loss: 2.813, gen_loss: 13.585, Ret_loss 2.813, FS_loss 21.972, KL_loss: 114839668151842.531, 
	
12300/191900 (epoch 6) loss: 2.813, gen_loss: 13.587, Ret_loss 2.813, FS_loss 21.971, KL_loss: 114223265905823.234, 
	
12305/191900 (epoch 6) loss: 2.813, gen_loss: 13.588, Ret_loss 2.813, FS_loss 21.971, KL_loss: 114248580851116.438, 
	
12310/191900 (epoch 6) loss: 2.813, gen_loss: 13.589, Ret_loss 2.813, FS_loss 21.970, KL_loss: 113532175659500.562, 
	
12315/191900 (epoch 6) loss: 2.813, gen_loss: 13.592, Ret_loss 2.813, FS_loss 21.973, KL_loss: 112908010536545.516, 
	
12320/191900 (epoch 6) loss: 2.812, gen_loss: 13.591, Ret_loss 2.812, FS_loss 21.971, KL_loss: 112208933658019.219, 
	
12325/191900 (epoch 6) loss: 2.812, gen_loss: 13.594, Ret_loss 2.812, FS_loss 21.972, KL_loss: 111536184407170.359, 
	
12330/191900 (epoch 6) loss: 2.812, gen_loss: 13.594, Ret_loss 2.812, FS_loss 21.970, KL_loss: 110854958238790.656, 
	
12335/191900 (epoch 6) loss: 2.811, gen_loss: 13.593, Ret_loss 2.811, FS_loss 21.968, KL_loss: 110182065267250.297, 
	
12340/191900 (epoch 6) loss: 2.811, gen_loss: 13.595, Ret_loss 2.811, FS_loss 21.970, KL_loss: 109590540011972.406, 
	
12345/191900 (epoch 6) loss: 2.811, gen_loss: 13.596, Ret_loss 2.811, FS_loss 21.969, KL_loss: 108936043911861.391, 
	
12350/191900 (epoch 6) loss: 2.811, gen_loss: 13.596, Ret_loss 2.811, FS_loss 21.967, KL_loss: 108372456167156.531, 
	
12355/191900 (epoch 6) loss: 2.810, gen_loss: 13.598, Ret_loss 2.810, FS_loss 21.969, KL_loss: 109780151855414.578, 
	
12360/191900 (epoch 6) loss: 2.811, gen_loss: 13.599, Ret_loss 2.811, FS_loss 21.969, KL_loss: 109132631043805.094, 
	
12365/191900 (epoch 6) loss: 2.810, gen_loss: 13.600, Ret_loss 2.810, FS_loss 21.970, KL_loss: 108527124396737.953, 
	
12370/191900 (epoch 6) loss: 2.810, gen_loss: 13.600, Ret_loss 2.810, FS_loss 21.969, KL_loss: 107897914587161.547, 
	
12375/191900 (epoch 6) loss: 2.811, gen_loss: 13.601, Ret_loss 2.811, FS_loss 21.969, KL_loss: 107277100230683.766, 
	
12380/191900 (epoch 6) loss: 2.811, gen_loss: 13.600, Ret_loss 2.811, FS_loss 21.968, KL_loss: 106718876976449.703, 
	
12385/191900 (epoch 6) loss: 2.811, gen_loss: 13.601, Ret_loss 2.811, FS_loss 21.968, KL_loss: 106108552897004.484, 
	
12390/191900 (epoch 6) loss: 2.811, gen_loss: 13.602, Ret_loss 2.811, FS_loss 21.966, KL_loss: 105622065774334.391, 
	
12395/191900 (epoch 6) loss: 2.811, gen_loss: 13.601, Ret_loss 2.811, FS_loss 21.964, KL_loss: 105041892743455.203, 
	
12400/191900 (epoch 6) loss: 2.811, gen_loss: 13.603, Ret_loss 2.811, FS_loss 21.964, KL_loss: 104461468540202.281, 
	
12405/191900 (epoch 6) loss: 2.810, gen_loss: 13.603, Ret_loss 2.810, FS_loss 21.963, KL_loss: 103900206298359.250, 
	
12410/191900 (epoch 6) loss: 2.810, gen_loss: 13.602, Ret_loss 2.810, FS_loss 21.960, KL_loss: 103325489829446.641, 
	
12415/191900 (epoch 6) loss: 2.810, gen_loss: 13.604, Ret_loss 2.810, FS_loss 21.961, KL_loss: 102857306411711.156, 
	
12420/191900 (epoch 6) loss: 2.810, gen_loss: 13.605, Ret_loss 2.810, FS_loss 21.961, KL_loss: 102301982364938.859, 
	
12425/191900 (epoch 6) loss: 2.810, gen_loss: 13.607, Ret_loss 2.810, FS_loss 21.964, KL_loss: 101748230500966.594, 
	
12430/191900 (epoch 6) loss: 2.809, gen_loss: 13.608, Ret_loss 2.809, FS_loss 21.964, KL_loss: 101559730337342.391, 
	
12435/191900 (epoch 6) loss: 2.809, gen_loss: 13.607, Ret_loss 2.809, FS_loss 21.962, KL_loss: 101011589359793.000, 
	
12440/191900 (epoch 6) loss: 2.809, gen_loss: 13.608, Ret_loss 2.809, FS_loss 21.962, KL_loss: 100470099832619.219, 
	
12445/191900 (epoch 6) loss: 2.808, gen_loss: 13.607, Ret_loss 2.808, FS_loss 21.959, KL_loss: 100058055546400.281, 
	
12450/191900 (epoch 6) loss: 2.807, gen_loss: 13.609, Ret_loss 2.807, FS_loss 21.961, KL_loss: 99530256816177.594, 
	
12455/191900 (epoch 6) loss: 2.808, gen_loss: 13.609, Ret_loss 2.808, FS_loss 21.960, KL_loss: 99059083409755.172, 
	
12460/191900 (epoch 6) loss: 2.808, gen_loss: 13.609, Ret_loss 2.808, FS_loss 21.957, KL_loss: 98539001129138.828, 
	
12465/191900 (epoch 6) loss: 2.809, gen_loss: 13.608, Ret_loss 2.809, FS_loss 21.953, KL_loss: 98868708222110.516, 
	
12470/191900 (epoch 6) loss: 2.809, gen_loss: 13.608, Ret_loss 2.809, FS_loss 21.952, KL_loss: 98352213351252.125, 
	
12475/191900 (epoch 6) loss: 2.808, gen_loss: 13.609, Ret_loss 2.808, FS_loss 21.951, KL_loss: 98079558205597.938, 
	
12480/191900 (epoch 6) loss: 2.808, gen_loss: 13.609, Ret_loss 2.808, FS_loss 21.951, KL_loss: 97600159430099.391, 
	
12485/191900 (epoch 6) loss: 2.809, gen_loss: 13.610, Ret_loss 2.809, FS_loss 21.950, KL_loss: 97137558845082.203, 
	
12490/191900 (epoch 6) loss: 2.809, gen_loss: 13.609, Ret_loss 2.809, FS_loss 21.948, KL_loss: 96643041787489.344, 
	
12495/191900 (epoch 6) loss: 2.808, gen_loss: 13.610, Ret_loss 2.808, FS_loss 21.949, KL_loss: 96154824689472.516, 
	
12500/191900 (epoch 6) loss: 2.807, gen_loss: 13.610, Ret_loss 2.807, FS_loss 21.949, KL_loss: 95699239034394.844, 
	
12505/191900 (epoch 6) loss: 2.807, gen_loss: 13.611, Ret_loss 2.807, FS_loss 21.949, KL_loss: 95895275147879.609, 
	
12510/191900 (epoch 6) loss: 2.808, gen_loss: 13.610, Ret_loss 2.808, FS_loss 21.946, KL_loss: 95627722205054.969, 
	
12515/191900 (epoch 6) loss: 2.809, gen_loss: 13.611, Ret_loss 2.809, FS_loss 21.946, KL_loss: 95154191783862.797, 
	
12520/191900 (epoch 6) loss: 2.808, gen_loss: 13.612, Ret_loss 2.808, FS_loss 21.948, KL_loss: 117520620000558.391, 
	
12525/191900 (epoch 6) loss: 2.808, gen_loss: 13.614, Ret_loss 2.808, FS_loss 21.949, KL_loss: 116946992508770.531, 
	
12530/191900 (epoch 6) loss: 2.808, gen_loss: 13.613, Ret_loss 2.808, FS_loss 21.946, KL_loss: 116374185506306.891, 
	
12535/191900 (epoch 6) loss: 2.807, gen_loss: 13.613, Ret_loss 2.807, FS_loss 21.945, KL_loss: 115830603995152.406, 
	
12540/191900 (epoch 6) loss: 2.807, gen_loss: 13.616, Ret_loss 2.807, FS_loss 21.948, KL_loss: 115267232640450.062, 
	
12545/191900 (epoch 6) loss: 2.807, gen_loss: 13.616, Ret_loss 2.807, FS_loss 21.948, KL_loss: 114886535772974.016, 
	
12550/191900 (epoch 6) loss: 2.807, gen_loss: 13.617, Ret_loss 2.807, FS_loss 21.947, KL_loss: 114381170203736.250, 
	
12555/191900 (epoch 6) loss: 2.807, gen_loss: 13.617, Ret_loss 2.807, FS_loss 21.947, KL_loss: 113844080791988.703, 
	
12560/191900 (epoch 6) loss: 2.807, gen_loss: 13.618, Ret_loss 2.807, FS_loss 21.946, KL_loss: 113332986984982.375, 
	
12565/191900 (epoch 6) loss: 2.807, gen_loss: 13.618, Ret_loss 2.807, FS_loss 21.946, KL_loss: 115663510792617.734, 
	
12570/191900 (epoch 6) loss: 2.807, gen_loss: 13.620, Ret_loss 2.807, FS_loss 21.946, KL_loss: 115116448444183.375, 
	
12575/191900 (epoch 6) loss: 2.806, gen_loss: 13.619, Ret_loss 2.806, FS_loss 21.944, KL_loss: 114581907779703.438, 
	
12580/191900 (epoch 6) loss: 2.806, gen_loss: 13.620, Ret_loss 2.806, FS_loss 21.945, KL_loss: 114045169161804.172, 
	
12585/191900 (epoch 6) loss: 2.806, gen_loss: 13.621, Ret_loss 2.806, FS_loss 21.945, KL_loss: 113569750133687.281, 
	
12590/191900 (epoch 6) loss: 2.805, gen_loss: 13.623, Ret_loss 2.805, FS_loss 21.948, KL_loss: 115331856727343.188, 
	
12595/191900 (epoch 6) loss: 2.805, gen_loss: 13.623, Ret_loss 2.805, FS_loss 21.947, KL_loss: 114798913720620.250, 
	
12600/191900 (epoch 6) loss: 2.805, gen_loss: 13.624, Ret_loss 2.805, FS_loss 21.946, KL_loss: 114270889671257.609, 
	
12605/191900 (epoch 6) loss: 2.805, gen_loss: 13.624, Ret_loss 2.805, FS_loss 21.946, KL_loss: 113748332384642.000, 
	
12610/191900 (epoch 6) loss: 2.805, gen_loss: 13.624, Ret_loss 2.805, FS_loss 21.946, KL_loss: 113229953910441.078, 
	
12615/191900 (epoch 6) loss: 2.804, gen_loss: 13.626, Ret_loss 2.804, FS_loss 21.948, KL_loss: 112718122249480.484, 
	
12620/191900 (epoch 6) loss: 2.804, gen_loss: 13.626, Ret_loss 2.804, FS_loss 21.949, KL_loss: 112209124038305.062, 
	
12625/191900 (epoch 6) loss: 2.804, gen_loss: 13.627, Ret_loss 2.804, FS_loss 21.948, KL_loss: 111709826108867.797, 
	
12630/191900 (epoch 6) loss: 2.803, gen_loss: 13.628, Ret_loss 2.803, FS_loss 21.949, KL_loss: 111210660286169.375, 
	
12635/191900 (epoch 6) loss: 2.803, gen_loss: 13.627, Ret_loss 2.803, FS_loss 21.949, KL_loss: 110716208097264.141, 
	
12640/191900 (epoch 6) loss: 2.803, gen_loss: 13.627, Ret_loss 2.803, FS_loss 21.949, KL_loss: 110714237206530.391, 
	
12645/191900 (epoch 6) loss: 2.802, gen_loss: 13.627, Ret_loss 2.802, FS_loss 21.949, KL_loss: 110225369566427.484, 
	
12650/191900 (epoch 6) loss: 2.802, gen_loss: 13.627, Ret_loss 2.802, FS_loss 21.950, KL_loss: 109780201035192.969, 
	
12655/191900 (epoch 6) loss: 2.802, gen_loss: 13.629, Ret_loss 2.802, FS_loss 21.951, KL_loss: 109300713018354.219, 
	
12660/191900 (epoch 6) loss: 2.802, gen_loss: 13.629, Ret_loss 2.802, FS_loss 21.951, KL_loss: 108827455683963.984, 
	
12665/191900 (epoch 6) loss: 2.801, gen_loss: 13.630, Ret_loss 2.801, FS_loss 21.951, KL_loss: 108381025539909.891, 
	
12670/191900 (epoch 6) loss: 2.802, gen_loss: 13.630, Ret_loss 2.802, FS_loss 21.950, KL_loss: 107914303878878.250, 
	
12675/191900 (epoch 6) loss: 2.802, gen_loss: 13.629, Ret_loss 2.802, FS_loss 21.948, KL_loss: 108195068414028.344, 
	
12680/191900 (epoch 6) loss: 2.802, gen_loss: 13.630, Ret_loss 2.802, FS_loss 21.949, KL_loss: 107731598115688.750, 
	
12685/191900 (epoch 6) loss: 2.801, gen_loss: 13.630, Ret_loss 2.801, FS_loss 21.949, KL_loss: 107281938003924.859, 
	
12690/191900 (epoch 6) loss: 2.801, gen_loss: 13.631, Ret_loss 2.801, FS_loss 21.950, KL_loss: 106826506995611.625, 
	
12695/191900 (epoch 6) loss: 2.801, gen_loss: 13.632, Ret_loss 2.801, FS_loss 21.951, KL_loss: 106388496893936.953, 
	
12700/191900 (epoch 6) loss: 2.801, gen_loss: 13.634, Ret_loss 2.801, FS_loss 21.952, KL_loss: 105942964345998.875, 
	
12705/191900 (epoch 6) loss: 2.801, gen_loss: 13.634, Ret_loss 2.801, FS_loss 21.951, KL_loss: 105499080890040.375, 
	
12710/191900 (epoch 6) loss: 2.801, gen_loss: 13.633, Ret_loss 2.801, FS_loss 21.948, KL_loss: 105064037743629.359, 
	
12715/191900 (epoch 6) loss: 2.801, gen_loss: 13.634, Ret_loss 2.801, FS_loss 21.949, KL_loss: 104800742704142.156, 
	
12720/191900 (epoch 6) loss: 2.800, gen_loss: 13.637, Ret_loss 2.800, FS_loss 21.953, KL_loss: 104368631356173.047, 
	
12725/191900 (epoch 6) loss: 2.800, gen_loss: 13.640, Ret_loss 2.800, FS_loss 21.956, KL_loss: 105923242467336.984, 
	
12730/191900 (epoch 6) loss: 2.801, gen_loss: 13.640, Ret_loss 2.801, FS_loss 21.955, KL_loss: 105488093113030.266, 
	
12735/191900 (epoch 6) loss: 2.800, gen_loss: 13.642, Ret_loss 2.800, FS_loss 21.957, KL_loss: 105057797004351.797, 
	
12740/191900 (epoch 6) loss: 2.800, gen_loss: 13.643, Ret_loss 2.800, FS_loss 21.959, KL_loss: 104629869732918.344, 
	
12745/191900 (epoch 6) loss: 2.799, gen_loss: 13.643, Ret_loss 2.799, FS_loss 21.959, KL_loss: 104205435493562.281, 
	
12750/191900 (epoch 6) loss: 2.799, gen_loss: 13.644, Ret_loss 2.799, FS_loss 21.960, KL_loss: 103790827894805.625, 
	
12755/191900 (epoch 6) loss: 2.799, gen_loss: 13.646, Ret_loss 2.799, FS_loss 21.960, KL_loss: 103373465532584.297, 
	
12760/191900 (epoch 6) loss: 2.799, gen_loss: 13.646, Ret_loss 2.799, FS_loss 21.961, KL_loss: 102998778197574.312, 
	
12765/191900 (epoch 6) loss: 2.798, gen_loss: 13.647, Ret_loss 2.798, FS_loss 21.961, KL_loss: 102591497707461.219, 
	
12770/191900 (epoch 6) loss: 2.798, gen_loss: 13.648, Ret_loss 2.798, FS_loss 21.961, KL_loss: 102210236720733.375, 
	
12775/191900 (epoch 6) loss: 2.798, gen_loss: 13.649, Ret_loss 2.798, FS_loss 21.962, KL_loss: 102011355601003.203, 
	
12780/191900 (epoch 6) loss: 2.798, gen_loss: 13.651, Ret_loss 2.798, FS_loss 21.965, KL_loss: 101613347762851.766, 
	
12785/191900 (epoch 6) loss: 2.798, gen_loss: 13.652, Ret_loss 2.798, FS_loss 21.965, KL_loss: 101314182888370.812, 
	
12790/191900 (epoch 6) loss: 2.797, gen_loss: 13.654, Ret_loss 2.797, FS_loss 21.968, KL_loss: 100917798752897.609, 
	
12795/191900 (epoch 6) loss: 2.797, gen_loss: 13.655, Ret_loss 2.797, FS_loss 21.968, KL_loss: 100526745862428.453, 
	
12800/191900 (epoch 6) loss: 2.797, gen_loss: 13.656, Ret_loss 2.797, FS_loss 21.968, KL_loss: 100142113951534.047, 
	
12805/191900 (epoch 6) loss: 2.796, gen_loss: 13.656, Ret_loss 2.796, FS_loss 21.965, KL_loss: 99755356476219.547, 
	
12810/191900 (epoch 6) loss: 2.796, gen_loss: 13.657, Ret_loss 2.796, FS_loss 21.965, KL_loss: 99539830533064.047, 
	
12815/191900 (epoch 6) loss: 2.796, gen_loss: 13.657, Ret_loss 2.796, FS_loss 21.964, KL_loss: 99159022609633.031, 
	
12820/191900 (epoch 6) loss: 2.795, gen_loss: 13.658, Ret_loss 2.795, FS_loss 21.965, KL_loss: 98783000829798.531, 
	
12825/191900 (epoch 6) loss: 2.795, gen_loss: 13.660, Ret_loss 2.795, FS_loss 21.966, KL_loss: 98511382947281.266, 
	
12830/191900 (epoch 6) loss: 2.795, gen_loss: 13.662, Ret_loss 2.795, FS_loss 21.968, KL_loss: 98160607897153.797, 
	
12835/191900 (epoch 6) loss: 2.795, gen_loss: 13.664, Ret_loss 2.795, FS_loss 21.970, KL_loss: 97790783791045.234, 
	
12840/191900 (epoch 6) loss: 2.795, gen_loss: 13.665, Ret_loss 2.795, FS_loss 21.969, KL_loss: 97424893954991.078, 
	
12845/191900 (epoch 6) loss: 2.794, gen_loss: 13.667, Ret_loss 2.794, FS_loss 21.972, KL_loss: 97619486853535.234, 
	
12850/191900 (epoch 6) loss: 2.794, gen_loss: 13.668, Ret_loss 2.794, FS_loss 21.972, KL_loss: 97254535093287.156, 
	
12855/191900 (epoch 6) loss: 2.794, gen_loss: 13.668, Ret_loss 2.794, FS_loss 21.971, KL_loss: 96898211709479.016, 
	
12860/191900 (epoch 6) loss: 2.794, gen_loss: 13.668, Ret_loss 2.794, FS_loss 21.970, KL_loss: 96538945987376.562, 
	
12865/191900 (epoch 6) loss: 2.794, gen_loss: 13.668, Ret_loss 2.794, FS_loss 21.969, KL_loss: 96191651323911.672, 
	
12870/191900 (epoch 6) loss: 2.793, gen_loss: 13.669, Ret_loss 2.793, FS_loss 21.969, KL_loss: 95838366677284.875, 
	
12875/191900 (epoch 6) loss: 2.794, gen_loss: 13.670, Ret_loss 2.794, FS_loss 21.971, KL_loss: 95490314631551.531, 
	
12880/191900 (epoch 6) loss: 2.793, gen_loss: 13.673, Ret_loss 2.793, FS_loss 21.974, KL_loss: 97169950109976.250, 
	
12885/191900 (epoch 6) loss: 2.793, gen_loss: 13.674, Ret_loss 2.793, FS_loss 21.975, KL_loss: 96817355695795.219, 
	
12890/191900 (epoch 6) loss: 2.793, gen_loss: 13.675, Ret_loss 2.793, FS_loss 21.977, KL_loss: 96471511255260.219, 
	
12895/191900 (epoch 6) loss: 2.793, gen_loss: 13.676, Ret_loss 2.793, FS_loss 21.979, KL_loss: 96255653225901.844, 
	
12900/191900 (epoch 6) loss: 2.793, gen_loss: 13.678, Ret_loss 2.793, FS_loss 21.981, KL_loss: 95910076132636.328, 
	
12905/191900 (epoch 6) loss: 2.792, gen_loss: 13.678, Ret_loss 2.792, FS_loss 21.981, KL_loss: 95568800313363.219, 
	
12910/191900 (epoch 6) loss: 2.792, gen_loss: 13.678, Ret_loss 2.792, FS_loss 21.980, KL_loss: 97389534215249.453, 
	
12915/191900 (epoch 6) loss: 2.792, gen_loss: 13.680, Ret_loss 2.792, FS_loss 21.982, KL_loss: 97058994148883.812, 
	
12920/191900 (epoch 6) loss: 2.792, gen_loss: 13.682, Ret_loss 2.792, FS_loss 21.984, KL_loss: 96716938113203.125, 
	
12925/191900 (epoch 6) loss: 2.792, gen_loss: 13.682, Ret_loss 2.792, FS_loss 21.984, KL_loss: 96380227697291.328, 
	
12930/191900 (epoch 6) loss: 2.792, gen_loss: 13.682, Ret_loss 2.792, FS_loss 21.985, KL_loss: 96063599540695.266, 
	
12935/191900 (epoch 6) loss: 2.792, gen_loss: 13.683, Ret_loss 2.792, FS_loss 21.986, KL_loss: 95727438406100.156, 
	
12940/191900 (epoch 6) loss: 2.792, gen_loss: 13.684, Ret_loss 2.792, FS_loss 21.987, KL_loss: 95511105104317.000, 
	
12945/191900 (epoch 6) loss: 2.792, gen_loss: 13.684, Ret_loss 2.792, FS_loss 21.987, KL_loss: 95183774932392.844, 
	
12950/191900 (epoch 6) loss: 2.791, gen_loss: 13.686, Ret_loss 2.791, FS_loss 21.990, KL_loss: 94947354155199.062, 
	
12955/191900 (epoch 6) loss: 2.791, gen_loss: 13.686, Ret_loss 2.791, FS_loss 21.992, KL_loss: 94618499102820.922, 
	
12960/191900 (epoch 6) loss: 2.791, gen_loss: 13.686, Ret_loss 2.791, FS_loss 21.991, KL_loss: 94302376701560.031, 
	
12965/191900 (epoch 6) loss: 2.791, gen_loss: 13.686, Ret_loss 2.791, FS_loss 21.993, KL_loss: 93980094496933.109, 
	
12970/191900 (epoch 6) loss: 2.791, gen_loss: 13.687, Ret_loss 2.791, FS_loss 21.995, KL_loss: 136147662173474.344, 
	
12975/191900 (epoch 6) loss: 2.791, gen_loss: 13.688, Ret_loss 2.791, FS_loss 21.996, KL_loss: 135682059421618.781, 
	
12980/191900 (epoch 6) loss: 2.791, gen_loss: 13.689, Ret_loss 2.791, FS_loss 21.997, KL_loss: 135219622223800.547, 
	
12985/191900 (epoch 6) loss: 2.791, gen_loss: 13.689, Ret_loss 2.791, FS_loss 21.997, KL_loss: 134760554809798.000, 
	
12990/191900 (epoch 6) loss: 2.792, gen_loss: 13.689, Ret_loss 2.792, FS_loss 21.998, KL_loss: 134304377593344.094, 
	
12995/191900 (epoch 6) loss: 2.792, gen_loss: 13.690, Ret_loss 2.792, FS_loss 21.998, KL_loss: 133851717668581.141, 
	
13000/191900 (epoch 6) loss: 2.792, gen_loss: 13.691, Ret_loss 2.792, FS_loss 21.999, KL_loss: 133401674151633.781, 
	
13005/191900 (epoch 6) loss: 2.791, gen_loss: 13.691, Ret_loss 2.791, FS_loss 22.000, KL_loss: 132956035630200.875, 
	
13010/191900 (epoch 6) loss: 2.792, gen_loss: 13.691, Ret_loss 2.792, FS_loss 22.000, KL_loss: 132512190446622.859, 
	
13015/191900 (epoch 6) loss: 2.792, gen_loss: 13.692, Ret_loss 2.792, FS_loss 22.001, KL_loss: 132754307879048.438, 
	
13020/191900 (epoch 6) loss: 2.792, gen_loss: 13.693, Ret_loss 2.792, FS_loss 22.002, KL_loss: 132315167193559.656, 
	
13025/191900 (epoch 6) loss: 2.792, gen_loss: 13.692, Ret_loss 2.792, FS_loss 22.001, KL_loss: 131888063696495.156, 
	
13030/191900 (epoch 6) loss: 2.791, gen_loss: 13.693, Ret_loss 2.791, FS_loss 22.002, KL_loss: 131464616370365.094, 
	
13035/191900 (epoch 6) loss: 2.791, gen_loss: 13.693, Ret_loss 2.791, FS_loss 22.001, KL_loss: 131253821859880.453, 
	
13040/191900 (epoch 6) loss: 2.791, gen_loss: 13.694, Ret_loss 2.791, FS_loss 22.002, KL_loss: 130824187037447.969, 
	
13045/191900 (epoch 6) loss: 2.791, gen_loss: 13.694, Ret_loss 2.791, FS_loss 22.003, KL_loss: 130433872620282.062, 
	
13050/191900 (epoch 6) loss: 2.791, gen_loss: 13.696, Ret_loss 2.791, FS_loss 22.004, KL_loss: 130009786811156.906, 
	
13055/191900 (epoch 6) loss: 2.790, gen_loss: 13.696, Ret_loss 2.790, FS_loss 22.004, KL_loss: 129636617329444.938, 
	
13060/191900 (epoch 6) loss: 2.790, gen_loss: 13.697, Ret_loss 2.790, FS_loss 22.004, KL_loss: 129218639382661.797, 
	
13065/191900 (epoch 6) loss: 2.790, gen_loss: 13.697, Ret_loss 2.790, FS_loss 22.003, KL_loss: 128805750833289.312, 
	
13070/191900 (epoch 6) loss: 2.790, gen_loss: 13.698, Ret_loss 2.790, FS_loss 22.005, KL_loss: 133613635994831.250, 
	
13075/191900 (epoch 6) loss: 2.790, gen_loss: 13.699, Ret_loss 2.790, FS_loss 22.004, KL_loss: 133187456913644.094, 
	
13080/191900 (epoch 6) loss: 2.790, gen_loss: 13.700, Ret_loss 2.790, FS_loss 22.004, KL_loss: 132795416078677.203, 
	
13085/191900 (epoch 6) loss: 2.790, gen_loss: 13.699, Ret_loss 2.790, FS_loss 22.003, KL_loss: 133507259608608.656, 
	
13090/191900 (epoch 6) loss: 2.790, gen_loss: 13.699, Ret_loss 2.790, FS_loss 22.003, KL_loss: 133083997164832.391, 
	
13095/191900 (epoch 6) loss: 2.790, gen_loss: 13.699, Ret_loss 2.790, FS_loss 22.001, KL_loss: 132666246361295.219, 
	
13100/191900 (epoch 6) loss: 2.790, gen_loss: 13.701, Ret_loss 2.790, FS_loss 22.003, KL_loss: 132248319895564.984, 
	
13105/191900 (epoch 6) loss: 2.790, gen_loss: 13.703, Ret_loss 2.790, FS_loss 22.005, KL_loss: 131834627611567.031, 
	
13110/191900 (epoch 6) loss: 2.790, gen_loss: 13.704, Ret_loss 2.790, FS_loss 22.006, KL_loss: 131421971820823.641, 
	
13115/191900 (epoch 6) loss: 2.790, gen_loss: 13.704, Ret_loss 2.790, FS_loss 22.005, KL_loss: 131012234559517.484, 
	
13120/191900 (epoch 6) loss: 2.790, gen_loss: 13.705, Ret_loss 2.790, FS_loss 22.006, KL_loss: 130695864075385.781, 
	
13125/191900 (epoch 6) loss: 2.789, gen_loss: 13.706, Ret_loss 2.789, FS_loss 22.008, KL_loss: 130290805819538.188, 
	
13130/191900 (epoch 6) loss: 2.789, gen_loss: 13.707, Ret_loss 2.789, FS_loss 22.007, KL_loss: 129896157956468.438, 
	
13135/191900 (epoch 6) loss: 2.788, gen_loss: 13.706, Ret_loss 2.788, FS_loss 22.006, KL_loss: 129496477039355.969, 
	
13140/191900 (epoch 6) loss: 2.788, gen_loss: 13.707, Ret_loss 2.788, FS_loss 22.007, KL_loss: 129141499071385.484, 
	
13145/191900 (epoch 6) loss: 2.787, gen_loss: 13.708, Ret_loss 2.787, FS_loss 22.008, KL_loss: 128748550433820.938, 
	
13150/191900 (epoch 6) loss: 2.787, gen_loss: 13.708, Ret_loss 2.787, FS_loss 22.007, KL_loss: 128357772804034.781, 
	
13155/191900 (epoch 6) loss: 2.786, gen_loss: 13.709, Ret_loss 2.786, FS_loss 22.009, KL_loss: 129572431464935.750, 
	
13160/191900 (epoch 6) loss: 2.786, gen_loss: 13.710, Ret_loss 2.786, FS_loss 22.010, KL_loss: 129179101378221.859, 
	
13165/191900 (epoch 6) loss: 2.786, gen_loss: 13.711, Ret_loss 2.786, FS_loss 22.011, KL_loss: 128788272567464.062, 
	
13170/191900 (epoch 6) loss: 2.786, gen_loss: 13.711, Ret_loss 2.786, FS_loss 22.012, KL_loss: 128418355690802.594, 
	
13175/191900 (epoch 6) loss: 2.786, gen_loss: 13.712, Ret_loss 2.786, FS_loss 22.012, KL_loss: 128032200373305.375, 
	
13180/191900 (epoch 6) loss: 2.785, gen_loss: 13.713, Ret_loss 2.785, FS_loss 22.013, KL_loss: 127665775253455.547, 
	
13185/191900 (epoch 6) loss: 2.785, gen_loss: 13.714, Ret_loss 2.785, FS_loss 22.014, KL_loss: 127284319778445.547, 
	
13190/191900 (epoch 6) loss: 2.785, gen_loss: 13.714, Ret_loss 2.785, FS_loss 22.015, KL_loss: 126906159352624.469, 
	
13195/191900 (epoch 6) loss: 2.785, gen_loss: 13.715, Ret_loss 2.785, FS_loss 22.016, KL_loss: 126832772415314.562, 
	
13200/191900 (epoch 6) loss: 2.785, gen_loss: 13.715, Ret_loss 2.785, FS_loss 22.016, KL_loss: 126457263164332.312, 
	
13205/191900 (epoch 6) loss: 2.785, gen_loss: 13.717, Ret_loss 2.785, FS_loss 22.018, KL_loss: 126084831640996.688, 
	
13210/191900 (epoch 6) loss: 2.784, gen_loss: 13.719, Ret_loss 2.784, FS_loss 22.020, KL_loss: 125736927119249.656, 
	
13215/191900 (epoch 6) loss: 2.784, gen_loss: 13.720, Ret_loss 2.784, FS_loss 22.021, KL_loss: 125368165570333.250, 
	
13220/191900 (epoch 6) loss: 2.784, gen_loss: 13.720, Ret_loss 2.784, FS_loss 22.021, KL_loss: 125046947959388.156, 
	
13225/191900 (epoch 6) loss: 2.784, gen_loss: 13.722, Ret_loss 2.784, FS_loss 22.022, KL_loss: 124682268871758.438, 
	
13230/191900 (epoch 6) loss: 2.784, gen_loss: 13.723, Ret_loss 2.784, FS_loss 22.024, KL_loss: 124336948934453.906, 
	
13235/191900 (epoch 6) loss: 2.784, gen_loss: 13.725, Ret_loss 2.784, FS_loss 22.026, KL_loss: 123976569768553.922, 
	
13240/191900 (epoch 6) loss: 2.784, gen_loss: 13.725, Ret_loss 2.784, FS_loss 22.026, KL_loss: 123631850373719.531, 
	
13245/191900 (epoch 6) loss: 2.784, gen_loss: 13.726, Ret_loss 2.784, FS_loss 22.026, KL_loss: 123281564027652.797, 
	
13250/191900 (epoch 6) loss: 2.783, gen_loss: 13.727, Ret_loss 2.783, FS_loss 22.028, KL_loss: 122931040367303.625, 
	
13255/191900 (epoch 6) loss: 2.783, gen_loss: 13.729, Ret_loss 2.783, FS_loss 22.030, KL_loss: 122811276704942.656, 
	
13260/191900 (epoch 6) loss: 2.783, gen_loss: 13.728, Ret_loss 2.783, FS_loss 22.029, KL_loss: 122459916914913.734, 
	
13265/191900 (epoch 6) loss: 2.783, gen_loss: 13.729, Ret_loss 2.783, FS_loss 22.030, KL_loss: 122115656835290.078, 
	
13270/191900 (epoch 6) loss: 2.782, gen_loss: 13.730, Ret_loss 2.782, FS_loss 22.031, KL_loss: 121768560304089.031, 
	
13275/191900 (epoch 6) loss: 2.782, gen_loss: 13.730, Ret_loss 2.782, FS_loss 22.031, KL_loss: 121432414152276.922, 
	
13280/191900 (epoch 6) loss: 2.782, gen_loss: 13.731, Ret_loss 2.782, FS_loss 22.032, KL_loss: 121089430551776.922, 
	
13285/191900 (epoch 6) loss: 2.782, gen_loss: 13.732, Ret_loss 2.782, FS_loss 22.033, KL_loss: 120749090043190.391, 
	
13290/191900 (epoch 6) loss: 2.782, gen_loss: 13.733, Ret_loss 2.782, FS_loss 22.034, KL_loss: 120427556123228.562, 
	
13295/191900 (epoch 6) loss: 2.782, gen_loss: 13.734, Ret_loss 2.782, FS_loss 22.035, KL_loss: 120090034386737.781, 
	
13300/191900 (epoch 6) loss: 2.782, gen_loss: 13.734, Ret_loss 2.782, FS_loss 22.034, KL_loss: 122158215368127.031, 
	
13305/191900 (epoch 6) loss: 2.782, gen_loss: 13.734, Ret_loss 2.782, FS_loss 22.034, KL_loss: 121817442789681.500, 
	
13310/191900 (epoch 6) loss: 2.781, gen_loss: 13.735, Ret_loss 2.781, FS_loss 22.035, KL_loss: 121478581392429.938, 
	
13315/191900 (epoch 6) loss: 2.781, gen_loss: 13.735, Ret_loss 2.781, FS_loss 22.034, KL_loss: 121142588665476.188, 
	
13320/191900 (epoch 6) loss: 2.781, gen_loss: 13.736, Ret_loss 2.781, FS_loss 22.034, KL_loss: 120807483260957.250, 
	
13325/191900 (epoch 6) loss: 2.781, gen_loss: 13.736, Ret_loss 2.781, FS_loss 22.034, KL_loss: 120496473931425.406, 
	
13330/191900 (epoch 6) loss: 2.781, gen_loss: 13.737, Ret_loss 2.781, FS_loss 22.036, KL_loss: 120165177335075.156, 
	
13335/191900 (epoch 6) loss: 2.781, gen_loss: 13.738, Ret_loss 2.781, FS_loss 22.037, KL_loss: 119836949935588.250, 
	
13340/191900 (epoch 6) loss: 2.781, gen_loss: 13.740, Ret_loss 2.781, FS_loss 22.039, KL_loss: 119707123042576.188, 
	
13345/191900 (epoch 6) loss: 2.781, gen_loss: 13.740, Ret_loss 2.781, FS_loss 22.039, KL_loss: 119380686241805.203, 
	
13350/191900 (epoch 6) loss: 2.781, gen_loss: 13.741, Ret_loss 2.781, FS_loss 22.039, KL_loss: 119070436987434.984, 
	
13355/191900 (epoch 6) loss: 2.781, gen_loss: 13.742, Ret_loss 2.781, FS_loss 22.040, KL_loss: 118747734413178.375, 
	
13360/191900 (epoch 6) loss: 2.780, gen_loss: 13.743, Ret_loss 2.780, FS_loss 22.040, KL_loss: 118526621540715.484, 
	
13365/191900 (epoch 6) loss: 2.780, gen_loss: 13.744, Ret_loss 2.780, FS_loss 22.042, KL_loss: 118215304012496.797, 
	
13370/191900 (epoch 6) loss: 2.780, gen_loss: 13.745, Ret_loss 2.780, FS_loss 22.042, KL_loss: 117900116724676.797, 
	
13375/191900 (epoch 6) loss: 2.779, gen_loss: 13.746, Ret_loss 2.779, FS_loss 22.042, KL_loss: 117594018165923.672, 
	
13380/191900 (epoch 6) loss: 2.779, gen_loss: 13.747, Ret_loss 2.779, FS_loss 22.044, KL_loss: 117283061077220.500, 
	
13385/191900 (epoch 6) loss: 2.779, gen_loss: 13.748, Ret_loss 2.779, FS_loss 22.045, KL_loss: 116971533512086.766, 
	
13390/191900 (epoch 6) loss: 2.779, gen_loss: 13.749, Ret_loss 2.779, FS_loss 22.045, KL_loss: 186132386211781.969, 
	
13395/191900 (epoch 6) loss: 2.779, gen_loss: 13.750, Ret_loss 2.779, FS_loss 22.046, KL_loss: 185639335617961.281, 
	
13400/191900 (epoch 6) loss: 2.779, gen_loss: 13.752, Ret_loss 2.779, FS_loss 22.049, KL_loss: 185152155569713.438, 
	
13405/191900 (epoch 6) loss: 2.780, gen_loss: 13.752, Ret_loss 2.780, FS_loss 22.048, KL_loss: 184821947657863.094, 
	
13410/191900 (epoch 6) loss: 2.779, gen_loss: 13.753, Ret_loss 2.779, FS_loss 22.049, KL_loss: 184336180810671.375, 
	
13415/191900 (epoch 6) loss: 2.779, gen_loss: 13.755, Ret_loss 2.779, FS_loss 22.050, KL_loss: 189747666561195.000, 
	
13420/191900 (epoch 6) loss: 2.779, gen_loss: 13.756, Ret_loss 2.779, FS_loss 22.051, KL_loss: 189250169788349.562, 
	
13425/191900 (epoch 6) loss: 2.779, gen_loss: 13.756, Ret_loss 2.779, FS_loss 22.051, KL_loss: 188755281886799.656, 
	
13430/191900 (epoch 6) loss: 2.779, gen_loss: 13.758, Ret_loss 2.779, FS_loss 22.052, KL_loss: 188263179870950.625, 
	
13435/191900 (epoch 7) loss: 2.670, gen_loss: 14.182, Ret_loss 2.670, FS_loss 22.470, KL_loss: 6036180821.333, 
	
13440/191900 (epoch 7) loss: 2.748, gen_loss: 14.104, Ret_loss 2.748, FS_loss 22.345, KL_loss: 10818285614528.000, 
	
13445/191900 (epoch 7) loss: 2.788, gen_loss: 14.116, Ret_loss 2.788, FS_loss 22.288, KL_loss: 6662075602195.692, 
	
13450/191900 (epoch 7) loss: 2.767, gen_loss: 14.161, Ret_loss 2.767, FS_loss 22.351, KL_loss: 100926069967729.781, 
	
13455/191900 (epoch 7) loss: 2.770, gen_loss: 14.189, Ret_loss 2.770, FS_loss 22.330, KL_loss: 81370906210281.734, 
	
13460/191900 (epoch 7) loss: 2.749, gen_loss: 14.201, Ret_loss 2.749, FS_loss 22.357, KL_loss: 66860177166464.000, 
	
13465/191900 (epoch 7) loss: 2.735, gen_loss: 14.237, Ret_loss 2.735, FS_loss 22.404, KL_loss: 57119726059628.609, 
	
13470/191900 (epoch 7) loss: 2.725, gen_loss: 14.264, Ret_loss 2.725, FS_loss 22.437, KL_loss: 49626947168458.102, 
	
13475/191900 (epoch 7) loss: 2.742, gen_loss: 14.283, Ret_loss 2.742, FS_loss 22.473, KL_loss: 44054338047035.531, 
	
13480/191900 (epoch 7) loss: 2.750, gen_loss: 14.262, Ret_loss 2.750, FS_loss 22.435, KL_loss: 41377533200970.664, 
	
13485/191900 (epoch 7) loss: 2.752, gen_loss: 14.288, Ret_loss 2.752, FS_loss 22.470, KL_loss: 37493721333827.625, 
	
13490/191900 (epoch 7) loss: 2.753, gen_loss: 14.273, Ret_loss 2.753, FS_loss 22.464, KL_loss: 35776829413508.414, 
	
13495/191900 (epoch 7) loss: 2.743, gen_loss: 14.287, Ret_loss 2.743, FS_loss 22.478, KL_loss: 32966688078108.445, 
	
13500/191900 (epoch 7) loss: 2.744, gen_loss: 14.272, Ret_loss 2.744, FS_loss 22.448, KL_loss: 30582344082183.531, 
	
13505/191900 (epoch 7) loss: 2.748, gen_loss: 14.279, Ret_loss 2.748, FS_loss 22.445, KL_loss: 30143016154988.711, 
	
13510/191900 (epoch 7) loss: 2.746, gen_loss: 14.268, Ret_loss 2.746, FS_loss 22.421, KL_loss: 28230061812230.562, 
	
13515/191900 (epoch 7) loss: 2.751, gen_loss: 14.278, Ret_loss 2.751, FS_loss 22.438, KL_loss: 26595986961957.012, 
	
13520/191900 (epoch 7) loss: 2.750, gen_loss: 14.282, Ret_loss 2.750, FS_loss 22.439, KL_loss: 322816986124514.938, 
	
13525/191900 (epoch 7) loss: 2.747, gen_loss: 14.291, Ret_loss 2.747, FS_loss 22.449, KL_loss: 305560356318962.250, 
	
13530/191900 (epoch 7) loss: 2.743, gen_loss: 14.281, Ret_loss 2.743, FS_loss 22.432, KL_loss: 289993024028207.000, 
	
13535/191900 (epoch 7) loss: 2.741, gen_loss: 14.278, Ret_loss 2.741, FS_loss 22.416, KL_loss: 276395184725653.125, 
	
13540/191900 (epoch 7) loss: 2.740, gen_loss: 14.281, Ret_loss 2.740, FS_loss 22.417, KL_loss: 263608570511241.469, 
	
13545/191900 (epoch 7) loss: 2.741, gen_loss: 14.293, Ret_loss 2.741, FS_loss 22.423, KL_loss: 252165633227671.781, 
	
13550/191900 (epoch 7) loss: 2.737, gen_loss: 14.293, Ret_loss 2.737, FS_loss 22.417, KL_loss: 241568485765497.500, 
	
13555/191900 (epoch 7) loss: 2.736, gen_loss: 14.298, Ret_loss 2.736, FS_loss 22.427, KL_loss: 231791645156755.781, 
	
13560/191900 (epoch 7) loss: 2.739, gen_loss: 14.293, Ret_loss 2.739, FS_loss 22.420, KL_loss: 223601659331036.000, 
	
13565/191900 (epoch 7) loss: 2.738, gen_loss: 14.286, Ret_loss 2.738, FS_loss 22.416, KL_loss: 215198076566993.812, 
	
13570/191900 (epoch 7) loss: 2.736, gen_loss: 14.296, Ret_loss 2.736, FS_loss 22.429, KL_loss: 207590541101438.156, 
	
13575/191900 (epoch 7) loss: 2.734, gen_loss: 14.295, Ret_loss 2.734, FS_loss 22.437, KL_loss: 200343625457775.000, 
	
13580/191900 (epoch 7) loss: 2.733, gen_loss: 14.293, Ret_loss 2.733, FS_loss 22.430, KL_loss: 194760829681937.312, 
	
13585/191900 (epoch 7) loss: 2.735, gen_loss: 14.294, Ret_loss 2.735, FS_loss 22.430, KL_loss: 188423529784684.750, 
	
13590/191900 (epoch 7) loss: 2.733, gen_loss: 14.304, Ret_loss 2.733, FS_loss 22.445, KL_loss: 402079117852305.812, 
	
13595/191900 (epoch 7) loss: 2.731, gen_loss: 14.302, Ret_loss 2.731, FS_loss 22.437, KL_loss: 389859581189939.812, 
	
13600/191900 (epoch 7) loss: 2.730, gen_loss: 14.304, Ret_loss 2.730, FS_loss 22.436, KL_loss: 378295104163885.688, 
	
13605/191900 (epoch 7) loss: 2.725, gen_loss: 14.301, Ret_loss 2.725, FS_loss 22.430, KL_loss: 368901294824143.188, 
	
13610/191900 (epoch 7) loss: 2.726, gen_loss: 14.307, Ret_loss 2.726, FS_loss 22.443, KL_loss: 358552209569858.188, 
	
13615/191900 (epoch 7) loss: 2.722, gen_loss: 14.306, Ret_loss 2.722, FS_loss 22.448, KL_loss: 348803508818611.062, 
	
13620/191900 (epoch 7) loss: 2.719, gen_loss: 14.302, Ret_loss 2.719, FS_loss 22.442, KL_loss: 339774965261200.312, 
	
13625/191900 (epoch 7) loss: 2.719, gen_loss: 14.298, Ret_loss 2.719, FS_loss 22.435, KL_loss: 330996273348478.000, 
	
13630/191900 (epoch 7) loss: 2.716, gen_loss: 14.298, Ret_loss 2.716, FS_loss 22.434, KL_loss: 324734599170883.250, 
	
13635/191900 (epoch 7) loss: 2.714, gen_loss: 14.298, Ret_loss 2.714, FS_loss 22.439, KL_loss: 316737183952923.750, 
	
13640/191900 (epoch 7) loss: 2.717, gen_loss: 14.302, Ret_loss 2.717, FS_loss 22.450, KL_loss: 433061866786252.312, 
	
13645/191900 (epoch 7) loss: 2.716, gen_loss: 14.300, Ret_loss 2.716, FS_loss 22.447, KL_loss: 422897104167553.812, 
	
13650/191900 (epoch 7) loss: 2.718, gen_loss: 14.307, Ret_loss 2.718, FS_loss 22.461, KL_loss: 413258059754794.250, 
	
13655/191900 (epoch 7) loss: 2.720, gen_loss: 14.310, Ret_loss 2.720, FS_loss 22.468, KL_loss: 403996805208594.375, 
	
13660/191900 (epoch 7) loss: 2.721, gen_loss: 14.307, Ret_loss 2.721, FS_loss 22.462, KL_loss: 396045976519578.938, 
	
13665/191900 (epoch 7) loss: 2.722, gen_loss: 14.311, Ret_loss 2.722, FS_loss 22.468, KL_loss: 387562824765622.375, 
	
13670/191900 (epoch 7) loss: 2.720, gen_loss: 14.304, Ret_loss 2.720, FS_loss 22.460, KL_loss: 379430327991414.312, 
	
13675/191900 (epoch 7) loss: 2.721, gen_loss: 14.307, Ret_loss 2.721, FS_loss 22.465, KL_loss: 373372408147738.312, 
	
13680/191900 (epoch 7) loss: 2.722, gen_loss: 14.301, Ret_loss 2.722, FS_loss 22.454, KL_loss: 365880614677394.562, 
	
13685/191900 (epoch 7) loss: 2.721, gen_loss: 14.298, Ret_loss 2.721, FS_loss 22.454, KL_loss: 358712363342663.812, 
	
13690/191900 (epoch 7) loss: 2.721, gen_loss: 14.300, Ret_loss 2.721, FS_loss 22.458, KL_loss: 354437760599720.688, 
	
13695/191900 (epoch 7) loss: 2.721, gen_loss: 14.302, Ret_loss 2.721, FS_loss 22.471, KL_loss: 347700913970902.125, 
	
13700/191900 (epoch 7) loss: 2.720, gen_loss: 14.303, Ret_loss 2.720, FS_loss 22.470, KL_loss: 341220319901327.312, 
	
13705/191900 (epoch 7) loss: 2.719, gen_loss: 14.303, Ret_loss 2.719, FS_loss 22.473, KL_loss: 335106365790723.750, 
	
13710/191900 (epoch 7) loss: 2.719, gen_loss: 14.308, Ret_loss 2.719, FS_loss 22.482, KL_loss: 329080573456529.500, 
	
13715/191900 (epoch 7) loss: 2.718, gen_loss: 14.312, Ret_loss 2.718, FS_loss 22.491, KL_loss: 323294350163532.000, 
	
13720/191900 (epoch 7) loss: 2.718, gen_loss: 14.307, Ret_loss 2.718, FS_loss 22.482, KL_loss: 317682635782682.688, 
	
13725/191900 (epoch 7) loss: 2.717, gen_loss: 14.313, Ret_loss 2.717, FS_loss 22.493, KL_loss: 327249165050581.188, 
	
13730/191900 (epoch 7) loss: 2.717, gen_loss: 14.312, Ret_loss 2.717, FS_loss 22.490, KL_loss: 321762416023151.688, 
	
13735/191900 (epoch 7) loss: 2.718, gen_loss: 14.311, Ret_loss 2.718, FS_loss 22.488, KL_loss: 316587052565262.375, 
	
13740/191900 (epoch 7) loss: 2.717, gen_loss: 14.310, Ret_loss 2.717, FS_loss 22.487, KL_loss: 311494919527621.812, 
	
13745/191900 (epoch 7) loss: 2.715, gen_loss: 14.312, Ret_loss 2.715, FS_loss 22.492, KL_loss: 306565015271507.438, 
	
13750/191900 (epoch 7) loss: 2.714, gen_loss: 14.313, Ret_loss 2.714, FS_loss 22.493, KL_loss: 301769523799431.250, 
	
13755/191900 (epoch 7) loss: 2.712, gen_loss: 14.311, Ret_loss 2.712, FS_loss 22.490, KL_loss: 297131840764859.812, 
	
13760/191900 (epoch 7) loss: 2.714, gen_loss: 14.313, Ret_loss 2.714, FS_loss 22.496, KL_loss: 292854760509863.000, 
	
13765/191900 (epoch 7) loss: 2.714, gen_loss: 14.311, Ret_loss 2.714, FS_loss 22.494, KL_loss: 288463408668375.250, 
	
13770/191900 (epoch 7) loss: 2.714, gen_loss: 14.308, Ret_loss 2.714, FS_loss 22.490, KL_loss: 284349524684750.000, 
	
13775/191900 (epoch 7) loss: 2.715, gen_loss: 14.313, Ret_loss 2.715, FS_loss 22.499, KL_loss: 280223926470636.594, 
	
13780/191900 (epoch 7) loss: 2.715, gen_loss: 14.315, Ret_loss 2.715, FS_loss 22.503, KL_loss: 276259522834736.562, 
	
13785/191900 (epoch 7) loss: 2.714, gen_loss: 14.318, Ret_loss 2.714, FS_loss 22.505, KL_loss: 272353723282416.031, 
	
13790/191900 (epoch 7) loss: 2.713, gen_loss: 14.313, Ret_loss 2.713, FS_loss 22.500, KL_loss: 268569379136790.875, 
	
13795/191900 (epoch 7) loss: 2.712, gen_loss: 14.313, Ret_loss 2.712, FS_loss 22.497, KL_loss: 264944347324933.656, 
	
13800/191900 (epoch 7) loss: 2.713, gen_loss: 14.311, Ret_loss 2.713, FS_loss 22.496, KL_loss: 261345743376672.000, 
	
13805/191900 (epoch 7) loss: 2.713, gen_loss: 14.315, Ret_loss 2.713, FS_loss 22.499, KL_loss: 257879778832876.781, 
	
13810/191900 (epoch 7) loss: 2.713, gen_loss: 14.315, Ret_loss 2.713, FS_loss 22.503, KL_loss: 254472180204905.656, 
	
13815/191900 (epoch 7) loss: 2.715, gen_loss: 14.314, Ret_loss 2.715, FS_loss 22.503, KL_loss: 251223311395996.406, 
	
13820/191900 (epoch 7) loss: 2.715, gen_loss: 14.314, Ret_loss 2.715, FS_loss 22.505, KL_loss: 247991303904476.375, 
	
13825/191900 (epoch 7) loss: 2.716, gen_loss: 14.312, Ret_loss 2.716, FS_loss 22.506, KL_loss: 247377490948240.625, 
	
13830/191900 (epoch 7) loss: 2.715, gen_loss: 14.312, Ret_loss 2.715, FS_loss 22.506, KL_loss: 244270133765931.750, 
	
13835/191900 (epoch 7) loss: 2.714, gen_loss: 14.315, Ret_loss 2.714, FS_loss 22.510, KL_loss: 241371748522074.219, 
	
13840/191900 (epoch 7) loss: 2.715, gen_loss: 14.317, Ret_loss 2.715, FS_loss 22.511, KL_loss: 238428320777972.719, 
	
13845/191900 (epoch 7) loss: 2.715, gen_loss: 14.314, Ret_loss 2.715, FS_loss 22.508, KL_loss: 236731281977288.219, 
	
13850/191900 (epoch 7) loss: 2.714, gen_loss: 14.317, Ret_loss 2.714, FS_loss 22.512, KL_loss: 233918273216878.250, 
	
13855/191900 (epoch 7) loss: 2.715, gen_loss: 14.316, Ret_loss 2.715, FS_loss 22.510, KL_loss: 231358861060017.312, 
	
13860/191900 (epoch 7) loss: 2.713, gen_loss: 14.317, Ret_loss 2.713, FS_loss 22.514, KL_loss: 228661437087144.688, 
	
13865/191900 (epoch 7) loss: 2.712, gen_loss: 14.317, Ret_loss 2.712, FS_loss 22.517, KL_loss: 226027139006931.062, 
	
13870/191900 (epoch 7) loss: 2.711, gen_loss: 14.316, Ret_loss 2.711, FS_loss 22.515, KL_loss: 223628381564473.281, 
	
13875/191900 (epoch 7) loss: 2.710, gen_loss: 14.315, Ret_loss 2.710, FS_loss 22.515, KL_loss: 221106600220920.500, 
	
13880/191900 (epoch 7) loss: 2.710, gen_loss: 14.317, Ret_loss 2.710, FS_loss 22.520, KL_loss: 218778643605242.281, 
	
13885/191900 (epoch 7) loss: 2.710, gen_loss: 14.317, Ret_loss 2.710, FS_loss 22.519, KL_loss: 216369952300055.750, 
	
13890/191900 (epoch 7) loss: 2.711, gen_loss: 14.314, Ret_loss 2.711, FS_loss 22.518, KL_loss: 214035041712059.812, 
	
13895/191900 (epoch 7) loss: 2.710, gen_loss: 14.317, Ret_loss 2.710, FS_loss 22.520, KL_loss: 211736140749409.312, 
	
13900/191900 (epoch 7) loss: 2.710, gen_loss: 14.318, Ret_loss 2.710, FS_loss 22.519, KL_loss: 209487926638989.125, 
	
13905/191900 (epoch 7) loss: 2.710, gen_loss: 14.317, Ret_loss 2.710, FS_loss 22.520, KL_loss: 207312650837889.344, 
	
13910/191900 (epoch 7) loss: 2.708, gen_loss: 14.321, Ret_loss 2.708, FS_loss 22.526, KL_loss: 205455112664285.719, 
	
13915/191900 (epoch 7) loss: 2.708, gen_loss: 14.321, Ret_loss 2.708, FS_loss 22.528, KL_loss: 203342413302182.969, 
	
13920/191900 (epoch 7) loss: 2.706, gen_loss: 14.324, Ret_loss 2.706, FS_loss 22.530, KL_loss: 201588367773590.031, 
	
13925/191900 (epoch 7) loss: 2.705, gen_loss: 14.325, Ret_loss 2.705, FS_loss 22.530, KL_loss: 199547827168805.375, 
	
13930/191900 (epoch 7) loss: 2.705, gen_loss: 14.328, Ret_loss 2.705, FS_loss 22.534, KL_loss: 197690383764236.344, 
	
13935/191900 (epoch 7) loss: 2.704, gen_loss: 14.331, Ret_loss 2.704, FS_loss 22.541, KL_loss: 195725564358378.125, 
	
13940/191900 (epoch 7) loss: 2.704, gen_loss: 14.334, Ret_loss 2.704, FS_loss 22.546, KL_loss: 199899683932606.500, 
	
13945/191900 (epoch 7) loss: 2.704, gen_loss: 14.336, Ret_loss 2.704, FS_loss 22.552, KL_loss: 197951519961508.188, 
	
13950/191900 (epoch 7) loss: 2.705, gen_loss: 14.339, Ret_loss 2.705, FS_loss 22.556, KL_loss: 196076822809956.812, 
	
13955/191900 (epoch 7) loss: 2.705, gen_loss: 14.341, Ret_loss 2.705, FS_loss 22.562, KL_loss: 194203300620116.688, 
	
13960/191900 (epoch 7) loss: 2.706, gen_loss: 14.344, Ret_loss 2.706, FS_loss 22.569, KL_loss: 192704398640730.188, 
	
13965/191900 (epoch 7) loss: 2.706, gen_loss: 14.344, Ret_loss 2.706, FS_loss 22.571, KL_loss: 190898297696752.625, 
	
13970/191900 (epoch 7) loss: 2.705, gen_loss: 14.344, Ret_loss 2.705, FS_loss 22.573, KL_loss: 189134231169409.438, 
	
13975/191900 (epoch 7) loss: 2.707, gen_loss: 14.347, Ret_loss 2.707, FS_loss 22.578, KL_loss: 187578313702455.625, 
	
13980/191900 (epoch 7) loss: 2.707, gen_loss: 14.347, Ret_loss 2.707, FS_loss 22.579, KL_loss: 185869098524250.625, 
	
13985/191900 (epoch 7) loss: 2.707, gen_loss: 14.349, Ret_loss 2.707, FS_loss 22.583, KL_loss: 184250428952506.562, 
	
13990/191900 (epoch 7) loss: 2.707, gen_loss: 14.352, Ret_loss 2.707, FS_loss 22.588, KL_loss: 182606571560076.375, 
	
13995/191900 (epoch 7) loss: 2.707, gen_loss: 14.352, Ret_loss 2.707, FS_loss 22.588, KL_loss: 180997880330189.969, 
	
14000/191900 (epoch 7) loss: 2.708, gen_loss: 14.353, Ret_loss 2.708, FS_loss 22.587, KL_loss: 180430772449335.000, 
	
14005/191900 (epoch 7) loss: 2.708, gen_loss: 14.354, Ret_loss 2.708, FS_loss 22.589, KL_loss: 178860591353122.406, 
	
14010/191900 (epoch 7) loss: 2.708, gen_loss: 14.356, Ret_loss 2.708, FS_loss 22.591, KL_loss: 177314804966732.188, 
	
14015/191900 (epoch 7) loss: 2.707, gen_loss: 14.358, Ret_loss 2.707, FS_loss 22.594, KL_loss: 175809202318786.531, 
	
14020/191900 (epoch 7) loss: 2.706, gen_loss: 14.358, Ret_loss 2.706, FS_loss 22.593, KL_loss: 174315422236793.031, 
	
14025/191900 (epoch 7) loss: 2.706, gen_loss: 14.361, Ret_loss 2.706, FS_loss 22.598, KL_loss: 172872858909886.812, 
	
14030/191900 (epoch 7) loss: 2.705, gen_loss: 14.361, Ret_loss 2.705, FS_loss 22.599, KL_loss: 171435312239464.469, 
	
14035/191900 (epoch 7) loss: 2.705, gen_loss: 14.359, Ret_loss 2.705, FS_loss 22.596, KL_loss: 170027095430766.375, 
	
14040/191900 (epoch 7) loss: 2.706, gen_loss: 14.359, Ret_loss 2.706, FS_loss 22.595, KL_loss: 168757087059141.906, 
	
14045/191900 (epoch 7) loss: 2.707, gen_loss: 14.358, Ret_loss 2.707, FS_loss 22.595, KL_loss: 167389113669216.875, 
	
14050/191900 (epoch 7) loss: 2.707, gen_loss: 14.360, Ret_loss 2.707, FS_loss 22.598, KL_loss: 166062637844058.312, 
	
14055/191900 (epoch 7) loss: 2.707, gen_loss: 14.362, Ret_loss 2.707, FS_loss 22.601, KL_loss: 164739231741563.281, 
	
14060/191900 (epoch 7) loss: 2.707, gen_loss: 14.363, Ret_loss 2.707, FS_loss 22.601, KL_loss: 163796489269987.469, 
	
14065/191900 (epoch 7) loss: 2.708, gen_loss: 14.365, Ret_loss 2.708, FS_loss 22.601, KL_loss: 162506334675845.875, 
	
14070/191900 (epoch 7) loss: 2.706, gen_loss: 14.366, Ret_loss 2.706, FS_loss 22.604, KL_loss: 169634762480696.969, 
	
14075/191900 (epoch 7) loss: 2.706, gen_loss: 14.365, Ret_loss 2.706, FS_loss 22.602, KL_loss: 168320558836106.156, 
	
14080/191900 (epoch 7) loss: 2.707, gen_loss: 14.367, Ret_loss 2.707, FS_loss 22.605, KL_loss: 167092032662625.188, 
	
14085/191900 (epoch 7) loss: 2.705, gen_loss: 14.372, Ret_loss 2.705, FS_loss 22.611, KL_loss: 165856098363272.031, 
	
14090/191900 (epoch 7) loss: 2.705, gen_loss: 14.372, Ret_loss 2.705, FS_loss 22.612, KL_loss: 164604850991946.688, 
	
14095/191900 (epoch 7) loss: 2.705, gen_loss: 14.375, Ret_loss 2.705, FS_loss 22.618, KL_loss: 163392490272328.594, 
	
14100/191900 (epoch 7) loss: 2.705, gen_loss: 14.375, Ret_loss 2.705, FS_loss 22.619, KL_loss: 162261605632731.969, 
	
14105/191900 (epoch 7) loss: 2.705, gen_loss: 14.374, Ret_loss 2.705, FS_loss 22.620, KL_loss: 161107281270685.875, 
	
14110/191900 (epoch 7) loss: 2.705, gen_loss: 14.374, Ret_loss 2.705, FS_loss 22.620, KL_loss: 159922043545251.875, 
	
14115/191900 (epoch 7) loss: 2.704, gen_loss: 14.374, Ret_loss 2.704, FS_loss 22.623, KL_loss: 158875790501875.250, 
	
14120/191900 (epoch 7) loss: 2.704, gen_loss: 14.376, Ret_loss 2.704, FS_loss 22.628, KL_loss: 157728730732099.719, 
	
14125/191900 (epoch 7) loss: 2.704, gen_loss: 14.375, Ret_loss 2.704, FS_loss 22.629, KL_loss: 156616756824270.125, 
	
14130/191900 (epoch 7) loss: 2.704, gen_loss: 14.375, Ret_loss 2.704, FS_loss 22.631, KL_loss: 155496551804501.812, 
	
14135/191900 (epoch 7) loss: 2.704, gen_loss: 14.377, Ret_loss 2.704, FS_loss 22.634, KL_loss: 154396608878795.188, 
	
14140/191900 (epoch 7) loss: 2.705, gen_loss: 14.377, Ret_loss 2.705, FS_loss 22.635, KL_loss: 153686331257395.344, 
	
14145/191900 (epoch 7) loss: 2.704, gen_loss: 14.378, Ret_loss 2.704, FS_loss 22.638, KL_loss: 152609035505844.250, 
	
14150/191900 (epoch 7) loss: 2.703, gen_loss: 14.378, Ret_loss 2.703, FS_loss 22.640, KL_loss: 151775095499410.188, 
	
14155/191900 (epoch 7) loss: 2.704, gen_loss: 14.379, Ret_loss 2.704, FS_loss 22.644, KL_loss: 150726298311822.344, 
	
14160/191900 (epoch 7) loss: 2.704, gen_loss: 14.378, Ret_loss 2.704, FS_loss 22.645, KL_loss: 152502234280866.469, 
	
14165/191900 (epoch 7) loss: 2.704, gen_loss: 14.377, Ret_loss 2.704, FS_loss 22.646, KL_loss: 151462033001903.688, 
	
14170/191900 (epoch 7) loss: 2.704, gen_loss: 14.376, Ret_loss 2.704, FS_loss 22.646, KL_loss: 150944194101655.938, 
	
14175/191900 (epoch 7) loss: 2.704, gen_loss: 14.375, Ret_loss 2.704, FS_loss 22.646, KL_loss: 149928512845963.188, 
	
14180/191900 (epoch 7) loss: 2.704, gen_loss: 14.377, Ret_loss 2.704, FS_loss 22.648, KL_loss: 148971799726930.125, 
	
14185/191900 (epoch 7) loss: 2.704, gen_loss: 14.376, Ret_loss 2.704, FS_loss 22.649, KL_loss: 147982732768918.281, 
	
14190/191900 (epoch 7) loss: 2.705, gen_loss: 14.376, Ret_loss 2.705, FS_loss 22.649, KL_loss: 147011455398558.062, 
	
14195/191900 (epoch 7) loss: 2.705, gen_loss: 14.375, Ret_loss 2.705, FS_loss 22.648, KL_loss: 146048498071914.344, 
	
14200/191900 (epoch 7) loss: 2.704, gen_loss: 14.376, Ret_loss 2.704, FS_loss 22.652, KL_loss: 145104471147936.000, 
	
14205/191900 (epoch 7) loss: 2.704, gen_loss: 14.376, Ret_loss 2.704, FS_loss 22.654, KL_loss: 144166731819323.281, 
	
14210/191900 (epoch 7) loss: 2.704, gen_loss: 14.377, Ret_loss 2.704, FS_loss 22.658, KL_loss: 143301785811728.438, 
	
14215/191900 (epoch 7) loss: 2.703, gen_loss: 14.379, Ret_loss 2.703, FS_loss 22.661, KL_loss: 142387750691579.750, 
	
14220/191900 (epoch 7) loss: 2.703, gen_loss: 14.382, Ret_loss 2.703, FS_loss 22.667, KL_loss: 141503034448526.938, 
	
14225/191900 (epoch 7) loss: 2.704, gen_loss: 14.383, Ret_loss 2.704, FS_loss 22.669, KL_loss: 140612711439030.719, 
	
14230/191900 (epoch 7) loss: 2.703, gen_loss: 14.385, Ret_loss 2.703, FS_loss 22.672, KL_loss: 139744030782661.609, 
	
14235/191900 (epoch 7) loss: 2.703, gen_loss: 14.384, Ret_loss 2.703, FS_loss 22.672, KL_loss: 140112393855985.969, 
	
14240/191900 (epoch 7) loss: 2.703, gen_loss: 14.383, Ret_loss 2.703, FS_loss 22.674, KL_loss: 139245483343256.078, 
	
14245/191900 (epoch 7) loss: 2.703, gen_loss: 14.385, Ret_loss 2.703, FS_loss 22.677, KL_loss: 138411788923021.062, 
	
14250/191900 (epoch 7) loss: 2.703, gen_loss: 14.385, Ret_loss 2.703, FS_loss 22.679, KL_loss: 137566011991360.469, 
	
14255/191900 (epoch 7) loss: 2.703, gen_loss: 14.384, Ret_loss 2.703, FS_loss 22.678, KL_loss: 136740747488431.438, 
	
14260/191900 (epoch 7) loss: 2.703, gen_loss: 14.385, Ret_loss 2.703, FS_loss 22.681, KL_loss: 135915965681310.297, 
	
14265/191900 (epoch 7) loss: 2.704, gen_loss: 14.387, Ret_loss 2.704, FS_loss 22.683, KL_loss: 135177033141876.172, 
	
14270/191900 (epoch 7) loss: 2.703, gen_loss: 14.389, Ret_loss 2.703, FS_loss 22.688, KL_loss: 134381058861043.781, 
	
14275/191900 (epoch 7) loss: 2.703, gen_loss: 14.391, Ret_loss 2.703, FS_loss 22.693, KL_loss: 133761471941089.031, 
	
14280/191900 (epoch 7) loss: 2.703, gen_loss: 14.392, Ret_loss 2.703, FS_loss 22.696, KL_loss: 132973625669016.156, 
	
14285/191900 (epoch 7) loss: 2.702, gen_loss: 14.393, Ret_loss 2.702, FS_loss 22.698, KL_loss: 135712465066012.812, 
	
14290/191900 (epoch 7) loss: 2.702, gen_loss: 14.393, Ret_loss 2.702, FS_loss 22.700, KL_loss: 134944119627936.219, 
	
14295/191900 (epoch 7) loss: 2.702, gen_loss: 14.392, Ret_loss 2.702, FS_loss 22.702, KL_loss: 134162395075802.625, 
	
14300/191900 (epoch 7) loss: 2.702, gen_loss: 14.394, Ret_loss 2.702, FS_loss 22.704, KL_loss: 133390726021732.578, 
	
14305/191900 (epoch 7) loss: 2.702, gen_loss: 14.394, Ret_loss 2.702, FS_loss 22.705, KL_loss: 132626882745116.734, 
	
14310/191900 (epoch 7) loss: 2.701, gen_loss: 14.395, Ret_loss 2.701, FS_loss 22.709, KL_loss: 131881123634923.875, 
	
14315/191900 (epoch 7) loss: 2.702, gen_loss: 14.395, Ret_loss 2.702, FS_loss 22.711, KL_loss: 131134913941707.234, 
	
14320/191900 (epoch 7) loss: 2.702, gen_loss: 14.396, Ret_loss 2.702, FS_loss 22.714, KL_loss: 130457260738333.109, 
	
14325/191900 (epoch 7) loss: 2.701, gen_loss: 14.396, Ret_loss 2.701, FS_loss 22.715, KL_loss: 129787203191090.453, 
	
14330/191900 (epoch 7) loss: 2.701, gen_loss: 14.395, Ret_loss 2.701, FS_loss 22.715, KL_loss: 129077163739144.266, 
	
14335/191900 (epoch 7) loss: 2.701, gen_loss: 14.395, Ret_loss 2.701, FS_loss 22.715, KL_loss: 128415039900860.531, 
	
14340/191900 (epoch 7) loss: 2.701, gen_loss: 14.395, Ret_loss 2.701, FS_loss 22.716, KL_loss: 127718734537077.562, 
	
14345/191900 (epoch 7) loss: 2.702, gen_loss: 14.395, Ret_loss 2.702, FS_loss 22.716, KL_loss: 127043926250000.547, 
	
14350/191900 (epoch 7) loss: 2.701, gen_loss: 14.397, Ret_loss 2.701, FS_loss 22.722, KL_loss: 126397447668224.281, 
	
14355/191900 (epoch 7) loss: 2.702, gen_loss: 14.398, Ret_loss 2.702, FS_loss 22.723, KL_loss: 125714603624471.578, 
	
14360/191900 (epoch 7) loss: 2.702, gen_loss: 14.398, Ret_loss 2.702, FS_loss 22.724, KL_loss: 125051785709651.031, 
	
14365/191900 (epoch 7) loss: 2.702, gen_loss: 14.398, Ret_loss 2.702, FS_loss 22.724, KL_loss: 124383021174756.844, 
	
14370/191900 (epoch 7) loss: 2.702, gen_loss: 14.398, Ret_loss 2.702, FS_loss 22.725, KL_loss: 124179035825629.344, 
	
14375/191900 (epoch 7) loss: 2.702, gen_loss: 14.400, Ret_loss 2.702, FS_loss 22.728, KL_loss: 123520792082778.672, 
	
14380/191900 (epoch 7) loss: 2.702, gen_loss: 14.400, Ret_loss 2.702, FS_loss 22.728, KL_loss: 122871478454606.047, 
	
14385/191900 (epoch 7) loss: 2.701, gen_loss: 14.403, Ret_loss 2.701, FS_loss 22.731, KL_loss: 122256144931141.844, 
	
14390/191900 (epoch 7) loss: 2.702, gen_loss: 14.404, Ret_loss 2.702, FS_loss 22.733, KL_loss: 121618919069427.969, 
	
14395/191900 (epoch 7) loss: 2.701, gen_loss: 14.404, Ret_loss 2.701, FS_loss 22.732, KL_loss: 122000940181720.125, 
	
14400/191900 (epoch 7) loss: 2.701, gen_loss: 14.407, Ret_loss 2.701, FS_loss 22.736, KL_loss: 121372156782635.641, 
	
14405/191900 (epoch 7) loss: 2.701, gen_loss: 14.409, Ret_loss 2.701, FS_loss 22.740, KL_loss: 121001154211382.469, 
	
14410/191900 (epoch 7) loss: 2.700, gen_loss: 14.407, Ret_loss 2.700, FS_loss 22.739, KL_loss: 120383597784301.938, 
	
14415/191900 (epoch 7) loss: 2.700, gen_loss: 14.406, Ret_loss 2.700, FS_loss 22.739, KL_loss: 125154045720616.891, 
	
14420/191900 (epoch 7) loss: 2.699, gen_loss: 14.405, Ret_loss 2.699, FS_loss 22.736, KL_loss: 124520760914285.609, 
	
14425/191900 (epoch 7) loss: 2.700, gen_loss: 14.405, Ret_loss 2.700, FS_loss 22.737, KL_loss: 123893897046373.062, 
	
14430/191900 (epoch 7) loss: 2.700, gen_loss: 14.403, Ret_loss 2.700, FS_loss 22.736, KL_loss: 123274612855931.375, 
	
14435/191900 (epoch 7) loss: 2.701, gen_loss: 14.403, Ret_loss 2.701, FS_loss 22.737, KL_loss: 122665121888615.625, 
	
14440/191900 (epoch 7) loss: 2.701, gen_loss: 14.404, Ret_loss 2.701, FS_loss 22.738, KL_loss: 122059057839618.281, 
	
14445/191900 (epoch 7) loss: 2.701, gen_loss: 14.404, Ret_loss 2.701, FS_loss 22.738, KL_loss: 122239130428866.078, 
	
14450/191900 (epoch 7) loss: 2.700, gen_loss: 14.405, Ret_loss 2.700, FS_loss 22.741, KL_loss: 121640586046299.281, 
	
14455/191900 (epoch 7) loss: 2.700, gen_loss: 14.406, Ret_loss 2.700, FS_loss 22.741, KL_loss: 121093873381126.000, 
	
14460/191900 (epoch 7) loss: 2.699, gen_loss: 14.405, Ret_loss 2.699, FS_loss 22.742, KL_loss: 120564161789053.766, 
	
14465/191900 (epoch 7) loss: 2.700, gen_loss: 14.405, Ret_loss 2.700, FS_loss 22.743, KL_loss: 119990696421249.359, 
	
14470/191900 (epoch 7) loss: 2.699, gen_loss: 14.406, Ret_loss 2.699, FS_loss 22.744, KL_loss: 119413919830302.328, 
	
14475/191900 (epoch 7) loss: 2.699, gen_loss: 14.407, Ret_loss 2.699, FS_loss 22.747, KL_loss: 118871679711593.547, 
	
14480/191900 (epoch 7) loss: 2.698, gen_loss: 14.408, Ret_loss 2.698, FS_loss 22.751, KL_loss: 118306700896609.953, 
	
14485/191900 (epoch 7) loss: 2.698, gen_loss: 14.407, Ret_loss 2.698, FS_loss 22.750, KL_loss: 117810563663491.031, 
	
14490/191900 (epoch 7) loss: 2.698, gen_loss: 14.409, Ret_loss 2.698, FS_loss 22.756, KL_loss: 117256023579431.438, 
	
14495/191900 (epoch 7) loss: 2.698, gen_loss: 14.408, Ret_loss 2.698, FS_loss 22.755, KL_loss: 116722043254872.859, 
	
14500/191900 (epoch 7) loss: 2.698, gen_loss: 14.409, Ret_loss 2.698, FS_loss 22.760, KL_loss: 116177663305105.016, 
	
14505/191900 (epoch 7) loss: 2.697, gen_loss: 14.410, Ret_loss 2.697, FS_loss 22.762, KL_loss: 115846874222464.359, 
	
14510/191900 (epoch 7) loss: 2.698, gen_loss: 14.411, Ret_loss 2.698, FS_loss 22.764, KL_loss: 115311527054985.969, 
	
14515/191900 (epoch 7) loss: 2.697, gen_loss: 14.412, Ret_loss 2.697, FS_loss 22.766, KL_loss: 115005447355650.359, 
	
14520/191900 (epoch 7) loss: 2.697, gen_loss: 14.412, Ret_loss 2.697, FS_loss 22.767, KL_loss: 114477318828403.062, 
	
14525/191900 (epoch 7) loss: 2.697, gen_loss: 14.412, Ret_loss 2.697, FS_loss 22.769, KL_loss: 114003558896266.422, 
	
14530/191900 (epoch 7) loss: 2.697, gen_loss: 14.412, Ret_loss 2.697, FS_loss 22.772, KL_loss: 113485081392389.359, 
	
14535/191900 (epoch 7) loss: 2.697, gen_loss: 14.413, Ret_loss 2.697, FS_loss 22.774, KL_loss: 112977909122830.859, 
	
14540/191900 (epoch 7) loss: 2.697, gen_loss: 14.414, Ret_loss 2.697, FS_loss 22.778, KL_loss: 112469874764369.562, 
	
14545/191900 (epoch 7) loss: 2.697, gen_loss: 14.414, Ret_loss 2.697, FS_loss 22.779, KL_loss: 112210027263356.203, 
	
14550/191900 (epoch 7) loss: 2.696, gen_loss: 14.413, Ret_loss 2.696, FS_loss 22.780, KL_loss: 111709178103777.094, 
	
14555/191900 (epoch 7) loss: 2.696, gen_loss: 14.414, Ret_loss 2.696, FS_loss 22.783, KL_loss: 111277480893955.422, 
	
14560/191900 (epoch 7) loss: 2.695, gen_loss: 14.415, Ret_loss 2.695, FS_loss 22.786, KL_loss: 111155459536353.359, 
	
14565/191900 (epoch 7) loss: 2.695, gen_loss: 14.415, Ret_loss 2.695, FS_loss 22.789, KL_loss: 110665568604570.547, 
	
14570/191900 (epoch 7) loss: 2.695, gen_loss: 14.415, Ret_loss 2.695, FS_loss 22.790, KL_loss: 110180851934204.625, 
	
14575/191900 (epoch 7) loss: 2.695, gen_loss: 14.415, Ret_loss 2.695, FS_loss 22.792, KL_loss: 109804141164296.953, 
	
14580/191900 (epoch 7) loss: 2.695, gen_loss: 14.415, Ret_loss 2.695, FS_loss 22.793, KL_loss: 109327352807079.922, 
	
14585/191900 (epoch 7) loss: 2.695, gen_loss: 14.416, Ret_loss 2.695, FS_loss 22.795, KL_loss: 108894251012233.000, 
	
14590/191900 (epoch 7) loss: 2.694, gen_loss: 14.416, Ret_loss 2.694, FS_loss 22.798, KL_loss: 108425865080526.266, 
	
14595/191900 (epoch 7) loss: 2.694, gen_loss: 14.416, Ret_loss 2.694, FS_loss 22.798, KL_loss: 108526779271048.469, 
	
14600/191900 (epoch 7) loss: 2.694, gen_loss: 14.415, Ret_loss 2.694, FS_loss 22.798, KL_loss: 108104902080019.500, 
	
14605/191900 (epoch 7) loss: 2.694, gen_loss: 14.416, Ret_loss 2.694, FS_loss 22.800, KL_loss: 107690652431972.172, 
	
14610/191900 (epoch 7) loss: 2.694, gen_loss: 14.415, Ret_loss 2.694, FS_loss 22.801, KL_loss: 107240161542963.062, 
	
14615/191900 (epoch 7) loss: 2.694, gen_loss: 14.416, Ret_loss 2.694, FS_loss 22.803, KL_loss: 106815766513380.297, 
	
14620/191900 (epoch 7) loss: 2.694, gen_loss: 14.417, Ret_loss 2.694, FS_loss 22.804, KL_loss: 106367392164072.938, 
	
14625/191900 (epoch 7) loss: 2.694, gen_loss: 14.419, Ret_loss 2.694, FS_loss 22.807, KL_loss: 105932407571659.641, 
	
14630/191900 (epoch 7) loss: 2.694, gen_loss: 14.420, Ret_loss 2.694, FS_loss 22.810, KL_loss: 105494671231736.953, 
	
14635/191900 (epoch 7) loss: 2.694, gen_loss: 14.420, Ret_loss 2.694, FS_loss 22.812, KL_loss: 105245849886534.656, 
	
14640/191900 (epoch 7) loss: 2.693, gen_loss: 14.420, Ret_loss 2.693, FS_loss 22.813, KL_loss: 104810324038196.766, 
	
14645/191900 (epoch 7) loss: 2.694, gen_loss: 14.421, Ret_loss 2.694, FS_loss 22.815, KL_loss: 104383189435561.891, 
	
14650/191900 (epoch 7) loss: 2.694, gen_loss: 14.422, Ret_loss 2.694, FS_loss 22.816, KL_loss: 103954959338519.750, 
	
14655/191900 (epoch 7) loss: 2.694, gen_loss: 14.422, Ret_loss 2.694, FS_loss 22.818, KL_loss: 103533785963454.062, 
	
14660/191900 (epoch 7) loss: 2.693, gen_loss: 14.423, Ret_loss 2.693, FS_loss 22.820, KL_loss: 103121274149526.312, 
	
14665/191900 (epoch 7) loss: 2.693, gen_loss: 14.424, Ret_loss 2.693, FS_loss 22.823, KL_loss: 102705622493031.391, 
	
14670/191900 (epoch 7) loss: 2.692, gen_loss: 14.425, Ret_loss 2.692, FS_loss 22.826, KL_loss: 102291954980994.891, 
	
14675/191900 (epoch 7) loss: 2.692, gen_loss: 14.425, Ret_loss 2.692, FS_loss 22.828, KL_loss: 101991451136440.125, 
	
14680/191900 (epoch 7) loss: 2.692, gen_loss: 14.425, Ret_loss 2.692, FS_loss 22.828, KL_loss: 101585454537756.109, 
	
14685/191900 (epoch 7) loss: 2.692, gen_loss: 14.426, Ret_loss 2.692, FS_loss 22.831, KL_loss: 101322413058770.641, 
	
14690/191900 (epoch 7) loss: 2.692, gen_loss: 14.426, Ret_loss 2.692, FS_loss 22.831, KL_loss: 100922517421082.250, 
	
14695/191900 (epoch 7) loss: 2.692, gen_loss: 14.426, Ret_loss 2.692, FS_loss 22.833, KL_loss: 100524530306885.719, 
	
14700/191900 (epoch 7) loss: 2.692, gen_loss: 14.429, Ret_loss 2.692, FS_loss 22.837, KL_loss: 100360072653780.594, 
	
14705/191900 (epoch 7) loss: 2.692, gen_loss: 14.429, Ret_loss 2.692, FS_loss 22.838, KL_loss: 99970560910430.312, 
	
14710/191900 (epoch 7) loss: 2.691, gen_loss: 14.430, Ret_loss 2.691, FS_loss 22.840, KL_loss: 99675235261045.984, 
	
14715/191900 (epoch 7) loss: 2.691, gen_loss: 14.430, Ret_loss 2.691, FS_loss 22.841, KL_loss: 99302099458447.266, 
	
14720/191900 (epoch 7) loss: 2.691, gen_loss: 14.431, Ret_loss 2.691, FS_loss 22.844, KL_loss: 101165399711240.156, 
	
14725/191900 (epoch 7) loss: 2.691, gen_loss: 14.432, Ret_loss 2.691, FS_loss 22.844, KL_loss: 100779640626058.203, 
	
14730/191900 (epoch 7) loss: 2.691, gen_loss: 14.432, Ret_loss 2.691, FS_loss 22.845, KL_loss: 152942658523884.688, 
	
14735/191900 (epoch 7) loss: 2.691, gen_loss: 14.433, Ret_loss 2.691, FS_loss 22.846, KL_loss: 152355772770451.188, 
	
14740/191900 (epoch 7) loss: 2.691, gen_loss: 14.435, Ret_loss 2.691, FS_loss 22.849, KL_loss: 151773381616269.406, 
	
14745/191900 (epoch 7) loss: 2.691, gen_loss: 14.436, Ret_loss 2.691, FS_loss 22.852, KL_loss: 151195532455703.594, 
	
14750/191900 (epoch 7) loss: 2.691, gen_loss: 14.437, Ret_loss 2.691, FS_loss 22.853, KL_loss: 150621960114803.000, 
	
14755/191900 (epoch 7) loss: 2.690, gen_loss: 14.439, Ret_loss 2.690, FS_loss 22.856, KL_loss: 150056772138270.000, 
	
14760/191900 (epoch 7) loss: 2.690, gen_loss: 14.440, Ret_loss 2.690, FS_loss 22.858, KL_loss: 149491834549031.312, 
	
14765/191900 (epoch 7) loss: 2.690, gen_loss: 14.441, Ret_loss 2.690, FS_loss 22.860, KL_loss: 148931139636141.406, 
	
14770/191900 (epoch 7) loss: 2.690, gen_loss: 14.442, Ret_loss 2.690, FS_loss 22.862, KL_loss: 148392250844127.469, 
	
14775/191900 (epoch 7) loss: 2.690, gen_loss: 14.443, Ret_loss 2.690, FS_loss 22.862, KL_loss: 147839893605628.000, 
	
14780/191900 (epoch 7) loss: 2.690, gen_loss: 14.443, Ret_loss 2.690, FS_loss 22.863, KL_loss: 147293893464531.562, 
	
14785/191900 (epoch 7) loss: 2.690, gen_loss: 14.444, Ret_loss 2.690, FS_loss 22.865, KL_loss: 146751474949165.781, 
	
14790/191900 (epoch 7) loss: 2.690, gen_loss: 14.445, Ret_loss 2.690, FS_loss 22.865, KL_loss: 146211379591620.062, 
	
14795/191900 (epoch 7) loss: 2.690, gen_loss: 14.444, Ret_loss 2.690, FS_loss 22.866, KL_loss: 145721601822274.875, 
	
14800/191900 (epoch 7) loss: 2.689, gen_loss: 14.445, Ret_loss 2.689, FS_loss 22.868, KL_loss: 150212809546574.969, 
	
14805/191900 (epoch 7) loss: 2.690, gen_loss: 14.447, Ret_loss 2.690, FS_loss 22.872, KL_loss: 149665824014974.781, 
	
14810/191900 (epoch 7) loss: 2.689, gen_loss: 14.448, Ret_loss 2.689, FS_loss 22.875, KL_loss: 149122952800211.031, 
	
14815/191900 (epoch 7) loss: 2.689, gen_loss: 14.450, Ret_loss 2.689, FS_loss 22.877, KL_loss: 148586217812927.219, 
	
14820/191900 (epoch 7) loss: 2.689, gen_loss: 14.450, Ret_loss 2.689, FS_loss 22.879, KL_loss: 148051129630616.344, 
	
14825/191900 (epoch 7) loss: 2.689, gen_loss: 14.451, Ret_loss 2.689, FS_loss 22.880, KL_loss: 147565928494202.406, 
	
14830/191900 (epoch 7) loss: 2.689, gen_loss: 14.452, Ret_loss 2.689, FS_loss 22.883, KL_loss: 147083654253545.656, 
	
14835/191900 (epoch 7) loss: 2.689, gen_loss: 14.451, Ret_loss 2.689, FS_loss 22.882, KL_loss: 146560110864913.531, 
	
14840/191900 (epoch 7) loss: 2.689, gen_loss: 14.451, Ret_loss 2.689, FS_loss 22.883, KL_loss: 146043129072863.625, 
	
14845/191900 (epoch 7) loss: 2.689, gen_loss: 14.452, Ret_loss 2.689, FS_loss 22.885, KL_loss: 145540984745699.562, 
	
14850/191900 (epoch 7) loss: 2.689, gen_loss: 14.453, Ret_loss 2.689, FS_loss 22.887, KL_loss: 145036422100003.750, 
	
14855/191900 (epoch 7) loss: 2.688, gen_loss: 14.454, Ret_loss 2.688, FS_loss 22.890, KL_loss: 144544576577118.281, 
	
14860/191900 (epoch 7) loss: 2.689, gen_loss: 14.454, Ret_loss 2.689, FS_loss 22.891, KL_loss: 144044797868969.594, 
	
14865/191900 (epoch 7) loss: 2.688, gen_loss: 14.453, Ret_loss 2.688, FS_loss 22.891, KL_loss: 143550160472865.406, 
	
14870/191900 (epoch 7) loss: 2.688, gen_loss: 14.452, Ret_loss 2.688, FS_loss 22.891, KL_loss: 143055765504948.156, 
	
14875/191900 (epoch 7) loss: 2.687, gen_loss: 14.453, Ret_loss 2.687, FS_loss 22.893, KL_loss: 142786585286486.750, 
	
14880/191900 (epoch 7) loss: 2.687, gen_loss: 14.453, Ret_loss 2.687, FS_loss 22.895, KL_loss: 142294958022918.719, 
	
14885/191900 (epoch 7) loss: 2.687, gen_loss: 14.455, Ret_loss 2.687, FS_loss 22.898, KL_loss: 141808628110349.031, 
	
14890/191900 (epoch 7) loss: 2.687, gen_loss: 14.456, Ret_loss 2.687, FS_loss 22.900, KL_loss: 141366113384509.469, 
	
14895/191900 (epoch 7) loss: 2.687, gen_loss: 14.456, Ret_loss 2.687, FS_loss 22.902, KL_loss: 140885003232091.156, 
	
14900/191900 (epoch 7) loss: 2.687, gen_loss: 14.456, Ret_loss 2.687, FS_loss 22.902, KL_loss: 140410035325081.109, 
	
14905/191900 (epoch 7) loss: 2.687, gen_loss: 14.457, Ret_loss 2.687, FS_loss 22.905, KL_loss: 139999810476675.391, 
	
14910/191900 (epoch 7) loss: 2.688, gen_loss: 14.456, Ret_loss 2.688, FS_loss 22.905, KL_loss: 139527556322097.188, 
	
14915/191900 (epoch 7) loss: 2.687, gen_loss: 14.457, Ret_loss 2.687, FS_loss 22.907, KL_loss: 139100801789377.172, 
	
14920/191900 (epoch 7) loss: 2.688, gen_loss: 14.458, Ret_loss 2.688, FS_loss 22.910, KL_loss: 138758355942776.781, 
	
14925/191900 (epoch 7) loss: 2.687, gen_loss: 14.458, Ret_loss 2.687, FS_loss 22.912, KL_loss: 138304159295971.875, 
	
14930/191900 (epoch 7) loss: 2.687, gen_loss: 14.457, Ret_loss 2.687, FS_loss 22.914, KL_loss: 137857565483951.000, 
	
14935/191900 (epoch 7) loss: 2.687, gen_loss: 14.457, Ret_loss 2.687, FS_loss 22.916, KL_loss: 137418205184329.406, 
	
14940/191900 (epoch 7) loss: 2.687, gen_loss: 14.457, Ret_loss 2.687, FS_loss 22.917, KL_loss: 136976004646050.625, 
	
14945/191900 (epoch 7) loss: 2.687, gen_loss: 14.456, Ret_loss 2.687, FS_loss 22.919, KL_loss: 136534770605470.547, 
	
14950/191900 (epoch 7) loss: 2.687, gen_loss: 14.455, Ret_loss 2.687, FS_loss 22.919, KL_loss: 136093406251585.094, 
	
14955/191900 (epoch 7) loss: 2.687, gen_loss: 14.455, Ret_loss 2.687, FS_loss 22.921, KL_loss: 135715682168153.922, 
	
14960/191900 (epoch 7) loss: 2.687, gen_loss: 14.457, Ret_loss 2.687, FS_loss 22.925, KL_loss: 135327025720863.828, 
	
14965/191900 (epoch 7) loss: 2.687, gen_loss: 14.457, Ret_loss 2.687, FS_loss 22.927, KL_loss: 134887922115508.188, 
	
14970/191900 (epoch 7) loss: 2.686, gen_loss: 14.457, Ret_loss 2.686, FS_loss 22.927, KL_loss: 134508037642969.391, 
	
14975/191900 (epoch 7) loss: 2.686, gen_loss: 14.457, Ret_loss 2.686, FS_loss 22.927, KL_loss: 134073170926498.094, 
	
14980/191900 (epoch 7) loss: 2.686, gen_loss: 14.457, Ret_loss 2.686, FS_loss 22.928, KL_loss: 133641789850713.641, 
	
14985/191900 (epoch 7) loss: 2.686, gen_loss: 14.458, Ret_loss 2.686, FS_loss 22.929, KL_loss: 133948233888255.344, 
	
14990/191900 (epoch 7) loss: 2.686, gen_loss: 14.457, Ret_loss 2.686, FS_loss 22.931, KL_loss: 133518692155609.875, 
	
14995/191900 (epoch 7) loss: 2.686, gen_loss: 14.457, Ret_loss 2.686, FS_loss 22.932, KL_loss: 133091744135687.859, 
	
15000/191900 (epoch 7) loss: 2.686, gen_loss: 14.457, Ret_loss 2.686, FS_loss 22.934, KL_loss: 133736614212098.281, 
	
15005/191900 (epoch 7) loss: 2.686, gen_loss: 14.457, Ret_loss 2.686, FS_loss 22.936, KL_loss: 133311612146348.516, 
	
15010/191900 (epoch 7) loss: 2.686, gen_loss: 14.457, Ret_loss 2.686, FS_loss 22.937, KL_loss: 132892285286051.859, 
	
15015/191900 (epoch 7) loss: 2.685, gen_loss: 14.457, Ret_loss 2.685, FS_loss 22.939, KL_loss: 132472913503617.859, 
	
15020/191900 (epoch 7) loss: 2.685, gen_loss: 14.456, Ret_loss 2.685, FS_loss 22.939, KL_loss: 132056105704465.734, 
	
15025/191900 (epoch 7) loss: 2.685, gen_loss: 14.455, Ret_loss 2.685, FS_loss 22.940, KL_loss: 131648522269923.875, 
	
15030/191900 (epoch 7) loss: 2.685, gen_loss: 14.455, Ret_loss 2.685, FS_loss 22.942, KL_loss: 131237061579720.578, 
	
15035/191900 (epoch 7) loss: 2.685, gen_loss: 14.454, Ret_loss 2.685, FS_loss 22.942, KL_loss: 130829371147067.562, 
	
15040/191900 (epoch 7) loss: 2.685, gen_loss: 14.453, Ret_loss 2.685, FS_loss 22.943, KL_loss: 130506313856004.781, 
	
15045/191900 (epoch 7) loss: 2.685, gen_loss: 14.452, Ret_loss 2.685, FS_loss 22.946, KL_loss: 130150867445687.312, 
	
15050/191900 (epoch 7) loss: 2.685, gen_loss: 14.452, Ret_loss 2.685, FS_loss 22.949, KL_loss: 129775280890726.531, 
	
15055/191900 (epoch 7) loss: 2.684, gen_loss: 14.451, Ret_loss 2.684, FS_loss 22.949, KL_loss: 129410289985632.844, 
	
15060/191900 (epoch 7) loss: 2.684, gen_loss: 14.451, Ret_loss 2.684, FS_loss 22.952, KL_loss: 129041944717447.547, 
	
15065/191900 (epoch 7) loss: 2.684, gen_loss: 14.449, Ret_loss 2.684, FS_loss 22.953, KL_loss: 128647689581579.594, 
	
15070/191900 (epoch 7) loss: 2.684, gen_loss: 14.448, Ret_loss 2.684, FS_loss 22.954, KL_loss: 128262045377741.984, 
	
15075/191900 (epoch 7) loss: 2.684, gen_loss: 14.448, Ret_loss 2.684, FS_loss 22.957, KL_loss: 127888585271725.734, 
	
15080/191900 (epoch 7) loss: 2.684, gen_loss: 14.448, Ret_loss 2.684, FS_loss 22.958, KL_loss: 127508391864001.547, 
	
15085/191900 (epoch 7) loss: 2.684, gen_loss: 14.446, Ret_loss 2.684, FS_loss 22.958, KL_loss: 127132405505824.672, 
	
15090/191900 (epoch 7) loss: 2.684, gen_loss: 14.445, Ret_loss 2.684, FS_loss 22.959, KL_loss: 126759966688694.203, 
	
15095/191900 (epoch 7) loss: 2.684, gen_loss: 14.445, Ret_loss 2.684, FS_loss 22.960, KL_loss: 126404854230120.984, 
	
15100/191900 (epoch 7) loss: 2.684, gen_loss: 14.445, Ret_loss 2.684, FS_loss 22.961, KL_loss: 126030788966031.344, 
	
15105/191900 (epoch 7) loss: 2.683, gen_loss: 14.443, Ret_loss 2.683, FS_loss 22.962, KL_loss: 125658858018204.844, 
	
15110/191900 (epoch 7) loss: 2.684, gen_loss: 14.443, Ret_loss 2.684, FS_loss 22.964, KL_loss: 125289713693936.141, 
	
15115/191900 (epoch 7) loss: 2.684, gen_loss: 14.443, Ret_loss 2.684, FS_loss 22.964, KL_loss: 124928399172630.203, 
	
15120/191900 (epoch 7) loss: 2.683, gen_loss: 14.442, Ret_loss 2.683, FS_loss 22.965, KL_loss: 124567389606198.297, 
	
15125/191900 (epoch 7) loss: 2.683, gen_loss: 14.442, Ret_loss 2.683, FS_loss 22.967, KL_loss: 124226314386187.953, 
	
15130/191900 (epoch 7) loss: 2.683, gen_loss: 14.442, Ret_loss 2.683, FS_loss 22.968, KL_loss: 123861131584906.094, 
	
15135/191900 (epoch 7) loss: 2.683, gen_loss: 14.442, Ret_loss 2.683, FS_loss 22.969, KL_loss: 123504925626860.766, 
	
15140/191900 (epoch 7) loss: 2.683, gen_loss: 14.442, Ret_loss 2.683, FS_loss 22.970, KL_loss: 123198995354674.062, 
	
15145/191900 (epoch 7) loss: 2.683, gen_loss: 14.442, Ret_loss 2.683, FS_loss 22.970, KL_loss: 122839837607331.938, 
	
15150/191900 (epoch 7) loss: 2.682, gen_loss: 14.441, Ret_loss 2.682, FS_loss 22.971, KL_loss: 122548484558194.438, 
	
15155/191900 (epoch 7) loss: 2.682, gen_loss: 14.442, Ret_loss 2.682, FS_loss 22.973, KL_loss: 122193346443509.750, 
	
15160/191900 (epoch 7) loss: 2.682, gen_loss: 14.442, Ret_loss 2.682, FS_loss 22.974, KL_loss: 121841063917240.594, 
	
15165/191900 (epoch 7) loss: 2.682, gen_loss: 14.443, Ret_loss 2.682, FS_loss 22.976, KL_loss: 369509819298829.312, 
	
15170/191900 (epoch 7) loss: 2.682, gen_loss: 14.443, Ret_loss 2.682, FS_loss 22.977, KL_loss: 368451830248894.312, 
	
15175/191900 (epoch 7) loss: 2.681, gen_loss: 14.443, Ret_loss 2.681, FS_loss 22.978, KL_loss: 367562628074520.938, 
	
15180/191900 (epoch 7) loss: 2.681, gen_loss: 14.443, Ret_loss 2.681, FS_loss 22.978, KL_loss: 366519172859706.875, 
	
15185/191900 (epoch 7) loss: 2.681, gen_loss: 14.445, Ret_loss 2.681, FS_loss 22.980, KL_loss: 365503104277144.438, 
	
15190/191900 (epoch 7) loss: 2.681, gen_loss: 14.445, Ret_loss 2.681, FS_loss 22.979, KL_loss: 364464394127320.125, 
	
15195/191900 (epoch 7) loss: 2.680, gen_loss: 14.447, Ret_loss 2.680, FS_loss 22.980, KL_loss: 363435667661877.750, 
	
15200/191900 (epoch 7) loss: 2.680, gen_loss: 14.448, Ret_loss 2.680, FS_loss 22.979, KL_loss: 363000124231767.750, 
	
15205/191900 (epoch 7) loss: 2.680, gen_loss: 14.452, Ret_loss 2.680, FS_loss 22.981, KL_loss: 361978370155955.750, 
	
15210/191900 (epoch 7) loss: 2.680, gen_loss: 14.456, Ret_loss 2.680, FS_loss 22.981, KL_loss: 360984376652881.500, 
	
15215/191900 (epoch 7) loss: 2.680, gen_loss: 14.459, Ret_loss 2.680, FS_loss 22.982, KL_loss: 359972593564441.438, 
	
15220/191900 (epoch 7) loss: 2.680, gen_loss: 14.462, Ret_loss 2.680, FS_loss 22.981, KL_loss: 358966720762116.875, 
	
15225/191900 (epoch 7) loss: 2.679, gen_loss: 14.465, Ret_loss 2.679, FS_loss 22.980, KL_loss: 357990787285544.562, 
	
15230/191900 (epoch 7) loss: 2.679, gen_loss: 14.468, Ret_loss 2.679, FS_loss 22.980, KL_loss: 356995622528789.062, 
	
15235/191900 (epoch 7) loss: 2.679, gen_loss: 14.470, Ret_loss 2.679, FS_loss 22.980, KL_loss: 356013728531594.875, 
	
15240/191900 (epoch 7) loss: 2.679, gen_loss: 14.473, Ret_loss 2.679, FS_loss 22.980, KL_loss: 355033214265588.375, 
	
15245/191900 (epoch 7) loss: 2.679, gen_loss: 14.477, Ret_loss 2.679, FS_loss 22.980, KL_loss: 354054580865650.688, 
	
15250/191900 (epoch 7) loss: 2.679, gen_loss: 14.480, Ret_loss 2.679, FS_loss 22.982, KL_loss: 353093198694073.000, 
	
15255/191900 (epoch 7) loss: 2.678, gen_loss: 14.483, Ret_loss 2.678, FS_loss 22.981, KL_loss: 352126433945308.750, 
	
15260/191900 (epoch 7) loss: 2.678, gen_loss: 14.486, Ret_loss 2.678, FS_loss 22.981, KL_loss: 351164136629863.938, 
	
15265/191900 (epoch 7) loss: 2.678, gen_loss: 14.489, Ret_loss 2.678, FS_loss 22.983, KL_loss: 350274728777840.562, 
	
15270/191900 (epoch 7) loss: 2.678, gen_loss: 14.492, Ret_loss 2.678, FS_loss 22.983, KL_loss: 349322602798720.438, 
	
15275/191900 (epoch 7) loss: 2.678, gen_loss: 14.496, Ret_loss 2.678, FS_loss 22.984, KL_loss: 348395248654841.312, 
	
15280/191900 (epoch 7) loss: 2.677, gen_loss: 14.499, Ret_loss 2.677, FS_loss 22.985, KL_loss: 347462870144004.125, 
	
15285/191900 (epoch 7) loss: 2.677, gen_loss: 14.504, Ret_loss 2.677, FS_loss 22.987, KL_loss: 346526282900751.062, 
	
15290/191900 (epoch 7) loss: 2.677, gen_loss: 14.507, Ret_loss 2.677, FS_loss 22.987, KL_loss: 345614191824097.688, 
	
15295/191900 (epoch 7) loss: 2.677, gen_loss: 14.511, Ret_loss 2.677, FS_loss 22.989, KL_loss: 344690722729471.438, 
	
15300/191900 (epoch 7) loss: 2.677, gen_loss: 14.514, Ret_loss 2.677, FS_loss 22.990, KL_loss: 343769616686454.688, 
	
15305/191900 (epoch 7) loss: 2.677, gen_loss: 14.517, Ret_loss 2.677, FS_loss 22.991, KL_loss: 342919870803270.125, 
	
15310/191900 (epoch 7) loss: 2.677, gen_loss: 14.520, Ret_loss 2.677, FS_loss 22.990, KL_loss: 342007637673008.812, 
	
15315/191900 (epoch 7) loss: 2.677, gen_loss: 14.523, Ret_loss 2.677, FS_loss 22.990, KL_loss: 341100961066344.250, 
	
15320/191900 (epoch 7) loss: 2.676, gen_loss: 14.526, Ret_loss 2.676, FS_loss 22.992, KL_loss: 340204929607341.312, 
	
15325/191900 (epoch 7) loss: 2.676, gen_loss: 14.529, Ret_loss 2.676, FS_loss 22.992, KL_loss: 339328620486893.750, 
	
15330/191900 (epoch 7) loss: 2.676, gen_loss: 14.531, Ret_loss 2.676, FS_loss 22.992, KL_loss: 338726699075167.250, 
	
15335/191900 (epoch 7) loss: 2.676, gen_loss: 14.535, Ret_loss 2.676, FS_loss 22.992, KL_loss: 337842338227505.938, 
	
15340/191900 (epoch 7) loss: 2.676, gen_loss: 14.538, Ret_loss 2.676, FS_loss 22.993, KL_loss: 336961675830132.188, 
	
15345/191900 (epoch 7) loss: 2.676, gen_loss: 14.542, Ret_loss 2.676, FS_loss 22.994, KL_loss: 336083737462756.938, 
	
15350/191900 (epoch 7) loss: 2.676, gen_loss: 14.544, Ret_loss 2.676, FS_loss 22.994, KL_loss: 335223297265181.125, 
	
15355/191900 (epoch 8) loss: 2.728, gen_loss: 15.896, Ret_loss 2.728, FS_loss 23.633, KL_loss: 359551393792.000, 
	
15360/191900 (epoch 8) loss: 2.657, gen_loss: 15.732, Ret_loss 2.657, FS_loss 23.584, KL_loss: 393805536369.778, 
	
15365/191900 (epoch 8) loss: 2.632, gen_loss: 15.843, Ret_loss 2.632, FS_loss 23.680, KL_loss: 54407523842925.711, 
	
15370/191900 (epoch 8) loss: 2.658, gen_loss: 15.786, Ret_loss 2.658, FS_loss 23.607, KL_loss: 40106371632289.688, 
	
15375/191900 (epoch 8) loss: 2.670, gen_loss: 15.815, Ret_loss 2.670, FS_loss 23.603, KL_loss: 31811808069461.332, 
	
15380/191900 (epoch 8) loss: 2.651, gen_loss: 15.840, Ret_loss 2.651, FS_loss 23.609, KL_loss: 26819355558876.691, 
	
15385/191900 (epoch 8) loss: 2.644, gen_loss: 15.850, Ret_loss 2.644, FS_loss 23.605, KL_loss: 22894192707102.117, 
	
15390/191900 (epoch 8) loss: 2.632, gen_loss: 15.879, Ret_loss 2.632, FS_loss 23.584, KL_loss: 33324177913908.512, 
	
15395/191900 (epoch 8) loss: 2.625, gen_loss: 15.877, Ret_loss 2.625, FS_loss 23.537, KL_loss: 29545710691002.184, 
	
15400/191900 (epoch 8) loss: 2.620, gen_loss: 15.832, Ret_loss 2.620, FS_loss 23.479, KL_loss: 26538063880024.816, 
	
15405/191900 (epoch 8) loss: 2.623, gen_loss: 15.826, Ret_loss 2.623, FS_loss 23.446, KL_loss: 24193815522190.223, 
	
15410/191900 (epoch 8) loss: 2.626, gen_loss: 15.821, Ret_loss 2.626, FS_loss 23.440, KL_loss: 22151922862461.832, 
	
15415/191900 (epoch 8) loss: 2.624, gen_loss: 15.850, Ret_loss 2.624, FS_loss 23.477, KL_loss: 22361736908224.000, 
	
15420/191900 (epoch 8) loss: 2.634, gen_loss: 15.806, Ret_loss 2.634, FS_loss 23.411, KL_loss: 20751283961203.016, 
	
15425/191900 (epoch 8) loss: 2.630, gen_loss: 15.795, Ret_loss 2.630, FS_loss 23.383, KL_loss: 19381150590754.594, 
	
15430/191900 (epoch 8) loss: 2.612, gen_loss: 15.774, Ret_loss 2.612, FS_loss 23.347, KL_loss: 23320931394521.113, 
	
15435/191900 (epoch 8) loss: 2.615, gen_loss: 15.763, Ret_loss 2.615, FS_loss 23.303, KL_loss: 21951534508568.383, 
	
15440/191900 (epoch 8) loss: 2.615, gen_loss: 15.798, Ret_loss 2.615, FS_loss 23.339, KL_loss: 20764895982764.586, 
	
15445/191900 (epoch 8) loss: 2.614, gen_loss: 15.822, Ret_loss 2.614, FS_loss 23.362, KL_loss: 20152885747058.383, 
	
15450/191900 (epoch 8) loss: 2.619, gen_loss: 15.818, Ret_loss 2.619, FS_loss 23.351, KL_loss: 19199036604788.363, 
	
15455/191900 (epoch 8) loss: 2.626, gen_loss: 15.837, Ret_loss 2.626, FS_loss 23.355, KL_loss: 20019298040477.539, 
	
15460/191900 (epoch 8) loss: 2.619, gen_loss: 15.831, Ret_loss 2.619, FS_loss 23.340, KL_loss: 19106795251618.055, 
	
15465/191900 (epoch 8) loss: 2.621, gen_loss: 15.841, Ret_loss 2.621, FS_loss 23.345, KL_loss: 18273515942462.879, 
	
15470/191900 (epoch 8) loss: 2.616, gen_loss: 15.853, Ret_loss 2.616, FS_loss 23.361, KL_loss: 17608463937295.059, 
	
15475/191900 (epoch 8) loss: 2.620, gen_loss: 15.851, Ret_loss 2.620, FS_loss 23.357, KL_loss: 16903255569374.967, 
	
15480/191900 (epoch 8) loss: 2.616, gen_loss: 15.837, Ret_loss 2.616, FS_loss 23.345, KL_loss: 137290189863626.422, 
	
15485/191900 (epoch 8) loss: 2.616, gen_loss: 15.823, Ret_loss 2.616, FS_loss 23.320, KL_loss: 132167727197443.828, 
	
15490/191900 (epoch 8) loss: 2.618, gen_loss: 15.814, Ret_loss 2.618, FS_loss 23.307, KL_loss: 127413715512901.984, 
	
15495/191900 (epoch 8) loss: 2.619, gen_loss: 15.808, Ret_loss 2.619, FS_loss 23.301, KL_loss: 123017683781077.328, 
	
15500/191900 (epoch 8) loss: 2.617, gen_loss: 15.810, Ret_loss 2.617, FS_loss 23.304, KL_loss: 118889978126466.578, 
	
15505/191900 (epoch 8) loss: 2.621, gen_loss: 15.817, Ret_loss 2.621, FS_loss 23.306, KL_loss: 115047006976192.828, 
	
15510/191900 (epoch 8) loss: 2.618, gen_loss: 15.809, Ret_loss 2.618, FS_loss 23.295, KL_loss: 111442287679095.141, 
	
15515/191900 (epoch 8) loss: 2.622, gen_loss: 15.812, Ret_loss 2.622, FS_loss 23.305, KL_loss: 108047751114058.922, 
	
15520/191900 (epoch 8) loss: 2.623, gen_loss: 15.811, Ret_loss 2.623, FS_loss 23.297, KL_loss: 107200707013668.359, 
	
15525/191900 (epoch 8) loss: 2.622, gen_loss: 15.804, Ret_loss 2.622, FS_loss 23.282, KL_loss: 104121282604685.234, 
	
15530/191900 (epoch 8) loss: 2.623, gen_loss: 15.795, Ret_loss 2.623, FS_loss 23.259, KL_loss: 101216282460726.344, 
	
15535/191900 (epoch 8) loss: 2.622, gen_loss: 15.787, Ret_loss 2.622, FS_loss 23.244, KL_loss: 98525729452672.000, 
	
15540/191900 (epoch 8) loss: 2.621, gen_loss: 15.789, Ret_loss 2.621, FS_loss 23.250, KL_loss: 95920929965196.875, 
	
15545/191900 (epoch 8) loss: 2.619, gen_loss: 15.795, Ret_loss 2.619, FS_loss 23.254, KL_loss: 93639705743059.141, 
	
15550/191900 (epoch 8) loss: 2.617, gen_loss: 15.780, Ret_loss 2.617, FS_loss 23.238, KL_loss: 91292161240979.938, 
	
15555/191900 (epoch 8) loss: 2.617, gen_loss: 15.785, Ret_loss 2.617, FS_loss 23.249, KL_loss: 89058447078495.375, 
	
15560/191900 (epoch 8) loss: 2.620, gen_loss: 15.785, Ret_loss 2.620, FS_loss 23.245, KL_loss: 87252487040293.969, 
	
15565/191900 (epoch 8) loss: 2.619, gen_loss: 15.785, Ret_loss 2.619, FS_loss 23.238, KL_loss: 85215565021523.734, 
	
15570/191900 (epoch 8) loss: 2.616, gen_loss: 15.795, Ret_loss 2.616, FS_loss 23.250, KL_loss: 83309660237838.031, 
	
15575/191900 (epoch 8) loss: 2.617, gen_loss: 15.788, Ret_loss 2.617, FS_loss 23.240, KL_loss: 81464615108493.719, 
	
15580/191900 (epoch 8) loss: 2.616, gen_loss: 15.783, Ret_loss 2.616, FS_loss 23.229, KL_loss: 79693533052995.078, 
	
15585/191900 (epoch 8) loss: 2.616, gen_loss: 15.782, Ret_loss 2.616, FS_loss 23.228, KL_loss: 78469394045991.391, 
	
15590/191900 (epoch 8) loss: 2.615, gen_loss: 15.776, Ret_loss 2.615, FS_loss 23.223, KL_loss: 76882541500300.312, 
	
15595/191900 (epoch 8) loss: 2.615, gen_loss: 15.772, Ret_loss 2.615, FS_loss 23.215, KL_loss: 75855392692992.000, 
	
15600/191900 (epoch 8) loss: 2.617, gen_loss: 15.772, Ret_loss 2.617, FS_loss 23.211, KL_loss: 74465793236428.594, 
	
15605/191900 (epoch 8) loss: 2.617, gen_loss: 15.773, Ret_loss 2.617, FS_loss 23.220, KL_loss: 73003266783856.875, 
	
15610/191900 (epoch 8) loss: 2.618, gen_loss: 15.773, Ret_loss 2.618, FS_loss 23.212, KL_loss: 71612941663999.016, 
	
15615/191900 (epoch 8) loss: 2.616, gen_loss: 15.763, Ret_loss 2.616, FS_loss 23.202, KL_loss: 73194468214074.188, 
	
15620/191900 (epoch 8) loss: 2.618, gen_loss: 15.759, Ret_loss 2.618, FS_loss 23.190, KL_loss: 71834571050851.922, 
	
15625/191900 (epoch 8) loss: 2.622, gen_loss: 15.759, Ret_loss 2.622, FS_loss 23.190, KL_loss: 70554454279949.078, 
	
15630/191900 (epoch 8) loss: 2.621, gen_loss: 15.760, Ret_loss 2.621, FS_loss 23.193, KL_loss: 69292182840540.219, 
	
15635/191900 (epoch 8) loss: 2.623, gen_loss: 15.763, Ret_loss 2.623, FS_loss 23.199, KL_loss: 68078898033948.844, 
	
15640/191900 (epoch 8) loss: 2.623, gen_loss: 15.764, Ret_loss 2.623, FS_loss 23.200, KL_loss: 69247084264547.211, 
	
15645/191900 (epoch 8) loss: 2.623, gen_loss: 15.768, Ret_loss 2.623, FS_loss 23.208, KL_loss: 68076360802230.859, 
	
15650/191900 (epoch 8) loss: 2.626, gen_loss: 15.767, Ret_loss 2.626, FS_loss 23.209, KL_loss: 95702110630809.250, 
	
15655/191900 (epoch 8) loss: 2.626, gen_loss: 15.763, Ret_loss 2.626, FS_loss 23.208, KL_loss: 94128115576266.953, 
	
15660/191900 (epoch 8) loss: 2.623, gen_loss: 15.762, Ret_loss 2.623, FS_loss 23.206, KL_loss: 92606314633814.984, 
	
15665/191900 (epoch 8) loss: 2.622, gen_loss: 15.762, Ret_loss 2.622, FS_loss 23.213, KL_loss: 91131836010407.141, 
	
15670/191900 (epoch 8) loss: 2.620, gen_loss: 15.763, Ret_loss 2.620, FS_loss 23.216, KL_loss: 89703716957969.656, 
	
15675/191900 (epoch 8) loss: 2.619, gen_loss: 15.766, Ret_loss 2.619, FS_loss 23.221, KL_loss: 88329846424113.781, 
	
15680/191900 (epoch 8) loss: 2.620, gen_loss: 15.758, Ret_loss 2.620, FS_loss 23.210, KL_loss: 86987733809400.219, 
	
15685/191900 (epoch 8) loss: 2.619, gen_loss: 15.766, Ret_loss 2.619, FS_loss 23.221, KL_loss: 85705030428027.406, 
	
15690/191900 (epoch 8) loss: 2.617, gen_loss: 15.767, Ret_loss 2.617, FS_loss 23.227, KL_loss: 84443254116949.328, 
	
15695/191900 (epoch 8) loss: 2.618, gen_loss: 15.767, Ret_loss 2.618, FS_loss 23.226, KL_loss: 83221468297483.156, 
	
15700/191900 (epoch 8) loss: 2.618, gen_loss: 15.766, Ret_loss 2.618, FS_loss 23.225, KL_loss: 120103281367143.984, 
	
15705/191900 (epoch 8) loss: 2.620, gen_loss: 15.768, Ret_loss 2.620, FS_loss 23.230, KL_loss: 118406916501626.391, 
	
15710/191900 (epoch 8) loss: 2.621, gen_loss: 15.767, Ret_loss 2.621, FS_loss 23.229, KL_loss: 116757833795613.953, 
	
15715/191900 (epoch 8) loss: 2.621, gen_loss: 15.767, Ret_loss 2.621, FS_loss 23.227, KL_loss: 115154464575299.516, 
	
15720/191900 (epoch 8) loss: 2.623, gen_loss: 15.768, Ret_loss 2.623, FS_loss 23.227, KL_loss: 113594151369446.672, 
	
15725/191900 (epoch 8) loss: 2.624, gen_loss: 15.774, Ret_loss 2.624, FS_loss 23.231, KL_loss: 137525454659232.516, 
	
15730/191900 (epoch 8) loss: 2.623, gen_loss: 15.776, Ret_loss 2.623, FS_loss 23.239, KL_loss: 135711377725722.688, 
	
15735/191900 (epoch 8) loss: 2.623, gen_loss: 15.771, Ret_loss 2.623, FS_loss 23.236, KL_loss: 133944976708748.328, 
	
15740/191900 (epoch 8) loss: 2.622, gen_loss: 15.773, Ret_loss 2.622, FS_loss 23.240, KL_loss: 132555701141516.172, 
	
15745/191900 (epoch 8) loss: 2.624, gen_loss: 15.770, Ret_loss 2.624, FS_loss 23.237, KL_loss: 130874163408086.734, 
	
15750/191900 (epoch 8) loss: 2.625, gen_loss: 15.765, Ret_loss 2.625, FS_loss 23.232, KL_loss: 129267573054226.922, 
	
15755/191900 (epoch 8) loss: 2.624, gen_loss: 15.763, Ret_loss 2.624, FS_loss 23.229, KL_loss: 127680713606409.188, 
	
15760/191900 (epoch 8) loss: 2.626, gen_loss: 15.758, Ret_loss 2.626, FS_loss 23.225, KL_loss: 126123990927226.359, 
	
15765/191900 (epoch 8) loss: 2.628, gen_loss: 15.758, Ret_loss 2.628, FS_loss 23.223, KL_loss: 124682330056626.391, 
	
15770/191900 (epoch 8) loss: 2.627, gen_loss: 15.757, Ret_loss 2.627, FS_loss 23.221, KL_loss: 123196813755220.016, 
	
15775/191900 (epoch 8) loss: 2.627, gen_loss: 15.757, Ret_loss 2.627, FS_loss 23.221, KL_loss: 121746738485703.547, 
	
15780/191900 (epoch 8) loss: 2.628, gen_loss: 15.754, Ret_loss 2.628, FS_loss 23.215, KL_loss: 120436569213125.219, 
	
15785/191900 (epoch 8) loss: 2.627, gen_loss: 15.753, Ret_loss 2.627, FS_loss 23.215, KL_loss: 119061636747048.406, 
	
15790/191900 (epoch 8) loss: 2.626, gen_loss: 15.754, Ret_loss 2.626, FS_loss 23.217, KL_loss: 117711025747544.922, 
	
15795/191900 (epoch 8) loss: 2.624, gen_loss: 15.750, Ret_loss 2.624, FS_loss 23.212, KL_loss: 117127846131575.062, 
	
15800/191900 (epoch 8) loss: 2.625, gen_loss: 15.749, Ret_loss 2.625, FS_loss 23.210, KL_loss: 115827024319213.469, 
	
15805/191900 (epoch 8) loss: 2.627, gen_loss: 15.749, Ret_loss 2.627, FS_loss 23.212, KL_loss: 114552533604660.156, 
	
15810/191900 (epoch 8) loss: 2.626, gen_loss: 15.750, Ret_loss 2.626, FS_loss 23.212, KL_loss: 113370506717073.844, 
	
15815/191900 (epoch 8) loss: 2.626, gen_loss: 15.750, Ret_loss 2.626, FS_loss 23.211, KL_loss: 112155602164693.234, 
	
15820/191900 (epoch 8) loss: 2.628, gen_loss: 15.747, Ret_loss 2.628, FS_loss 23.207, KL_loss: 110963402574598.281, 
	
15825/191900 (epoch 8) loss: 2.630, gen_loss: 15.746, Ret_loss 2.630, FS_loss 23.208, KL_loss: 110675568406849.078, 
	
15830/191900 (epoch 8) loss: 2.630, gen_loss: 15.745, Ret_loss 2.630, FS_loss 23.208, KL_loss: 109521223303100.922, 
	
15835/191900 (epoch 8) loss: 2.630, gen_loss: 15.745, Ret_loss 2.630, FS_loss 23.208, KL_loss: 108391715435038.938, 
	
15840/191900 (epoch 8) loss: 2.629, gen_loss: 15.745, Ret_loss 2.629, FS_loss 23.209, KL_loss: 107327729394251.641, 
	
15845/191900 (epoch 8) loss: 2.628, gen_loss: 15.747, Ret_loss 2.628, FS_loss 23.211, KL_loss: 106242874102010.047, 
	
15850/191900 (epoch 8) loss: 2.628, gen_loss: 15.744, Ret_loss 2.628, FS_loss 23.205, KL_loss: 105188214931490.109, 
	
15855/191900 (epoch 8) loss: 2.627, gen_loss: 15.744, Ret_loss 2.627, FS_loss 23.209, KL_loss: 112598331964498.547, 
	
15860/191900 (epoch 8) loss: 2.628, gen_loss: 15.743, Ret_loss 2.628, FS_loss 23.211, KL_loss: 111502868680053.438, 
	
15865/191900 (epoch 8) loss: 2.629, gen_loss: 15.739, Ret_loss 2.629, FS_loss 23.206, KL_loss: 110427278612680.469, 
	
15870/191900 (epoch 8) loss: 2.629, gen_loss: 15.737, Ret_loss 2.629, FS_loss 23.204, KL_loss: 110065156489564.484, 
	
15875/191900 (epoch 8) loss: 2.629, gen_loss: 15.735, Ret_loss 2.629, FS_loss 23.206, KL_loss: 109021146204395.719, 
	
15880/191900 (epoch 8) loss: 2.629, gen_loss: 15.736, Ret_loss 2.629, FS_loss 23.208, KL_loss: 108129284779576.375, 
	
15885/191900 (epoch 8) loss: 2.628, gen_loss: 15.737, Ret_loss 2.628, FS_loss 23.211, KL_loss: 107118529099585.438, 
	
15890/191900 (epoch 8) loss: 2.627, gen_loss: 15.737, Ret_loss 2.627, FS_loss 23.211, KL_loss: 106193427207399.062, 
	
15895/191900 (epoch 8) loss: 2.626, gen_loss: 15.737, Ret_loss 2.626, FS_loss 23.216, KL_loss: 116291894396387.062, 
	
15900/191900 (epoch 8) loss: 2.627, gen_loss: 15.732, Ret_loss 2.627, FS_loss 23.212, KL_loss: 115687035975252.172, 
	
15905/191900 (epoch 8) loss: 2.628, gen_loss: 15.734, Ret_loss 2.628, FS_loss 23.216, KL_loss: 114647636649327.141, 
	
15910/191900 (epoch 8) loss: 2.627, gen_loss: 15.735, Ret_loss 2.627, FS_loss 23.219, KL_loss: 113631269637888.688, 
	
15915/191900 (epoch 8) loss: 2.628, gen_loss: 15.734, Ret_loss 2.628, FS_loss 23.220, KL_loss: 116564535398188.703, 
	
15920/191900 (epoch 8) loss: 2.628, gen_loss: 15.730, Ret_loss 2.628, FS_loss 23.216, KL_loss: 115540319391516.562, 
	
15925/191900 (epoch 8) loss: 2.628, gen_loss: 15.727, Ret_loss 2.628, FS_loss 23.214, KL_loss: 114534359370476.594, 
	
15930/191900 (epoch 8) loss: 2.628, gen_loss: 15.726, Ret_loss 2.628, FS_loss 23.216, KL_loss: 113553626610232.812, 
	
15935/191900 (epoch 8) loss: 2.628, gen_loss: 15.727, Ret_loss 2.628, FS_loss 23.215, KL_loss: 112581839589263.125, 
	
15940/191900 (epoch 8) loss: 2.628, gen_loss: 15.727, Ret_loss 2.628, FS_loss 23.216, KL_loss: 111635148122970.188, 
	
15945/191900 (epoch 8) loss: 2.629, gen_loss: 15.728, Ret_loss 2.629, FS_loss 23.220, KL_loss: 110998344253246.281, 
	
15950/191900 (epoch 8) loss: 2.629, gen_loss: 15.727, Ret_loss 2.629, FS_loss 23.221, KL_loss: 110073894820724.891, 
	
15955/191900 (epoch 8) loss: 2.629, gen_loss: 15.728, Ret_loss 2.629, FS_loss 23.224, KL_loss: 109175774169806.203, 
	
15960/191900 (epoch 8) loss: 2.630, gen_loss: 15.722, Ret_loss 2.630, FS_loss 23.219, KL_loss: 108372627803372.453, 
	
15965/191900 (epoch 8) loss: 2.630, gen_loss: 15.722, Ret_loss 2.630, FS_loss 23.220, KL_loss: 107945648877687.453, 
	
15970/191900 (epoch 8) loss: 2.630, gen_loss: 15.722, Ret_loss 2.630, FS_loss 23.220, KL_loss: 107075364050093.078, 
	
15975/191900 (epoch 8) loss: 2.630, gen_loss: 15.722, Ret_loss 2.630, FS_loss 23.223, KL_loss: 106474860997946.469, 
	
15980/191900 (epoch 8) loss: 2.630, gen_loss: 15.721, Ret_loss 2.630, FS_loss 23.223, KL_loss: 105630384460862.875, 
	
15985/191900 (epoch 8) loss: 2.630, gen_loss: 15.718, Ret_loss 2.630, FS_loss 23.221, KL_loss: 104798330735334.359, 
	
15990/191900 (epoch 8) loss: 2.631, gen_loss: 15.716, Ret_loss 2.631, FS_loss 23.219, KL_loss: 104007683420588.875, 
	
15995/191900 (epoch 8) loss: 2.632, gen_loss: 15.711, Ret_loss 2.632, FS_loss 23.216, KL_loss: 103201441923045.969, 
	
16000/191900 (epoch 8) loss: 2.632, gen_loss: 15.711, Ret_loss 2.632, FS_loss 23.217, KL_loss: 102408865168953.000, 
	
16005/191900 (epoch 8) loss: 2.632, gen_loss: 15.711, Ret_loss 2.632, FS_loss 23.219, KL_loss: 101941778409227.156, 
	
16010/191900 (epoch 8) loss: 2.630, gen_loss: 15.706, Ret_loss 2.630, FS_loss 23.216, KL_loss: 101184751366236.656, 
	
16015/191900 (epoch 8) loss: 2.630, gen_loss: 15.703, Ret_loss 2.630, FS_loss 23.217, KL_loss: 100428316102482.703, 
	
16020/191900 (epoch 8) loss: 2.630, gen_loss: 15.701, Ret_loss 2.630, FS_loss 23.222, KL_loss: 107730131747182.781, 
	
16025/191900 (epoch 8) loss: 2.630, gen_loss: 15.696, Ret_loss 2.630, FS_loss 23.223, KL_loss: 106958501781163.109, 
	
16030/191900 (epoch 8) loss: 2.629, gen_loss: 15.689, Ret_loss 2.629, FS_loss 23.223, KL_loss: 106187822605530.109, 
	
16035/191900 (epoch 8) loss: 2.629, gen_loss: 15.686, Ret_loss 2.629, FS_loss 23.227, KL_loss: 105432414593047.391, 
	
16040/191900 (epoch 8) loss: 2.628, gen_loss: 15.681, Ret_loss 2.628, FS_loss 23.226, KL_loss: 104771281186369.578, 
	
16045/191900 (epoch 8) loss: 2.628, gen_loss: 15.680, Ret_loss 2.628, FS_loss 23.229, KL_loss: 104021265617355.797, 
	
16050/191900 (epoch 8) loss: 2.629, gen_loss: 15.679, Ret_loss 2.629, FS_loss 23.230, KL_loss: 103286685005972.875, 
	
16055/191900 (epoch 8) loss: 2.630, gen_loss: 15.676, Ret_loss 2.630, FS_loss 23.227, KL_loss: 102808454863615.453, 
	
16060/191900 (epoch 8) loss: 2.629, gen_loss: 15.677, Ret_loss 2.629, FS_loss 23.231, KL_loss: 102086491838189.047, 
	
16065/191900 (epoch 8) loss: 2.630, gen_loss: 15.676, Ret_loss 2.630, FS_loss 23.231, KL_loss: 101373214612998.641, 
	
16070/191900 (epoch 8) loss: 2.629, gen_loss: 15.678, Ret_loss 2.629, FS_loss 23.235, KL_loss: 100730921290345.562, 
	
16075/191900 (epoch 8) loss: 2.628, gen_loss: 15.675, Ret_loss 2.628, FS_loss 23.237, KL_loss: 100038367113894.359, 
	
16080/191900 (epoch 8) loss: 2.628, gen_loss: 15.671, Ret_loss 2.628, FS_loss 23.236, KL_loss: 99379297661921.969, 
	
16085/191900 (epoch 8) loss: 2.628, gen_loss: 15.667, Ret_loss 2.628, FS_loss 23.240, KL_loss: 99276340041141.531, 
	
16090/191900 (epoch 8) loss: 2.628, gen_loss: 15.664, Ret_loss 2.628, FS_loss 23.241, KL_loss: 98608066259700.047, 
	
16095/191900 (epoch 8) loss: 2.628, gen_loss: 15.661, Ret_loss 2.628, FS_loss 23.241, KL_loss: 97962444913652.469, 
	
16100/191900 (epoch 8) loss: 2.628, gen_loss: 15.664, Ret_loss 2.628, FS_loss 23.244, KL_loss: 97342197034094.234, 
	
16105/191900 (epoch 8) loss: 2.628, gen_loss: 15.664, Ret_loss 2.628, FS_loss 23.245, KL_loss: 96729242293668.500, 
	
16110/191900 (epoch 8) loss: 2.628, gen_loss: 15.665, Ret_loss 2.628, FS_loss 23.245, KL_loss: 96115955038852.391, 
	
16115/191900 (epoch 8) loss: 2.627, gen_loss: 15.664, Ret_loss 2.627, FS_loss 23.246, KL_loss: 95656718549441.844, 
	
16120/191900 (epoch 8) loss: 2.626, gen_loss: 15.662, Ret_loss 2.626, FS_loss 23.246, KL_loss: 95038872946791.359, 
	
16125/191900 (epoch 8) loss: 2.626, gen_loss: 15.661, Ret_loss 2.626, FS_loss 23.251, KL_loss: 94430424896154.297, 
	
16130/191900 (epoch 8) loss: 2.626, gen_loss: 15.658, Ret_loss 2.626, FS_loss 23.252, KL_loss: 119149396535971.156, 
	
16135/191900 (epoch 8) loss: 2.625, gen_loss: 15.654, Ret_loss 2.625, FS_loss 23.251, KL_loss: 118397791884036.734, 
	
16140/191900 (epoch 8) loss: 2.626, gen_loss: 15.649, Ret_loss 2.626, FS_loss 23.249, KL_loss: 117652352622041.234, 
	
16145/191900 (epoch 8) loss: 2.625, gen_loss: 15.645, Ret_loss 2.625, FS_loss 23.249, KL_loss: 117170293619476.797, 
	
16150/191900 (epoch 8) loss: 2.625, gen_loss: 15.643, Ret_loss 2.625, FS_loss 23.252, KL_loss: 116450264390602.969, 
	
16155/191900 (epoch 8) loss: 2.624, gen_loss: 15.639, Ret_loss 2.624, FS_loss 23.252, KL_loss: 115730233145048.047, 
	
16160/191900 (epoch 8) loss: 2.624, gen_loss: 15.636, Ret_loss 2.624, FS_loss 23.255, KL_loss: 115030354349426.391, 
	
16165/191900 (epoch 8) loss: 2.624, gen_loss: 15.632, Ret_loss 2.624, FS_loss 23.255, KL_loss: 114964209489632.703, 
	
16170/191900 (epoch 8) loss: 2.625, gen_loss: 15.631, Ret_loss 2.625, FS_loss 23.258, KL_loss: 114264320723856.250, 
	
16175/191900 (epoch 8) loss: 2.625, gen_loss: 15.628, Ret_loss 2.625, FS_loss 23.259, KL_loss: 113574164503124.031, 
	
16180/191900 (epoch 8) loss: 2.625, gen_loss: 15.627, Ret_loss 2.625, FS_loss 23.262, KL_loss: 112913857604134.453, 
	
16185/191900 (epoch 8) loss: 2.625, gen_loss: 15.626, Ret_loss 2.625, FS_loss 23.265, KL_loss: 112305548737793.375, 
	
16190/191900 (epoch 8) loss: 2.625, gen_loss: 15.622, Ret_loss 2.625, FS_loss 23.264, KL_loss: 111640766486261.469, 
	
16195/191900 (epoch 8) loss: 2.624, gen_loss: 15.618, Ret_loss 2.624, FS_loss 23.264, KL_loss: 111118997717515.672, 
	
16200/191900 (epoch 8) loss: 2.623, gen_loss: 15.617, Ret_loss 2.623, FS_loss 23.266, KL_loss: 110468462514614.578, 
	
16205/191900 (epoch 8) loss: 2.623, gen_loss: 15.615, Ret_loss 2.623, FS_loss 23.265, KL_loss: 109847811466711.984, 
	
16210/191900 (epoch 8) loss: 2.623, gen_loss: 15.615, Ret_loss 2.623, FS_loss 23.267, KL_loss: 110117361319916.484, 
	
16215/191900 (epoch 8) loss: 2.622, gen_loss: 15.613, Ret_loss 2.622, FS_loss 23.269, KL_loss: 109486653926304.734, 
	
16220/191900 (epoch 8) loss: 2.622, gen_loss: 15.608, Ret_loss 2.622, FS_loss 23.269, KL_loss: 109871321698529.797, 
	
16225/191900 (epoch 8) loss: 2.621, gen_loss: 15.604, Ret_loss 2.621, FS_loss 23.271, KL_loss: 109242834652180.656, 
	
16230/191900 (epoch 8) loss: 2.622, gen_loss: 15.600, Ret_loss 2.622, FS_loss 23.272, KL_loss: 108649047109773.688, 
	
16235/191900 (epoch 8) loss: 2.622, gen_loss: 15.593, Ret_loss 2.622, FS_loss 23.267, KL_loss: 108034894051575.453, 
	
16240/191900 (epoch 8) loss: 2.622, gen_loss: 15.589, Ret_loss 2.622, FS_loss 23.270, KL_loss: 107427566133185.375, 
	
16245/191900 (epoch 8) loss: 2.622, gen_loss: 15.585, Ret_loss 2.622, FS_loss 23.271, KL_loss: 106841589754357.266, 
	
16250/191900 (epoch 8) loss: 2.622, gen_loss: 15.583, Ret_loss 2.622, FS_loss 23.275, KL_loss: 106248243736919.562, 
	
16255/191900 (epoch 8) loss: 2.622, gen_loss: 15.580, Ret_loss 2.622, FS_loss 23.276, KL_loss: 105687017099157.094, 
	
16260/191900 (epoch 8) loss: 2.623, gen_loss: 15.578, Ret_loss 2.623, FS_loss 23.278, KL_loss: 105108543940156.969, 
	
16265/191900 (epoch 8) loss: 2.622, gen_loss: 15.574, Ret_loss 2.622, FS_loss 23.278, KL_loss: 104539113154180.906, 
	
16270/191900 (epoch 8) loss: 2.623, gen_loss: 15.569, Ret_loss 2.623, FS_loss 23.278, KL_loss: 104273032487528.875, 
	
16275/191900 (epoch 8) loss: 2.622, gen_loss: 15.565, Ret_loss 2.622, FS_loss 23.277, KL_loss: 103710802924550.234, 
	
16280/191900 (epoch 8) loss: 2.622, gen_loss: 15.561, Ret_loss 2.622, FS_loss 23.278, KL_loss: 114476098759836.391, 
	
16285/191900 (epoch 8) loss: 2.622, gen_loss: 15.558, Ret_loss 2.622, FS_loss 23.281, KL_loss: 113863277359264.344, 
	
16290/191900 (epoch 8) loss: 2.622, gen_loss: 15.555, Ret_loss 2.622, FS_loss 23.282, KL_loss: 113256999694942.188, 
	
16295/191900 (epoch 8) loss: 2.622, gen_loss: 15.553, Ret_loss 2.622, FS_loss 23.284, KL_loss: 112657460245775.594, 
	
16300/191900 (epoch 8) loss: 2.623, gen_loss: 15.550, Ret_loss 2.623, FS_loss 23.283, KL_loss: 112063920774390.688, 
	
16305/191900 (epoch 8) loss: 2.622, gen_loss: 15.549, Ret_loss 2.622, FS_loss 23.284, KL_loss: 111476802861000.859, 
	
16310/191900 (epoch 8) loss: 2.622, gen_loss: 15.547, Ret_loss 2.622, FS_loss 23.285, KL_loss: 117671180636980.719, 
	
16315/191900 (epoch 8) loss: 2.622, gen_loss: 15.545, Ret_loss 2.622, FS_loss 23.286, KL_loss: 117060961677930.891, 
	
16320/191900 (epoch 8) loss: 2.621, gen_loss: 15.543, Ret_loss 2.621, FS_loss 23.286, KL_loss: 116467780882227.656, 
	
16325/191900 (epoch 8) loss: 2.621, gen_loss: 15.540, Ret_loss 2.621, FS_loss 23.287, KL_loss: 115870829341133.141, 
	
16330/191900 (epoch 8) loss: 2.621, gen_loss: 15.537, Ret_loss 2.621, FS_loss 23.288, KL_loss: 115279714071576.703, 
	
16335/191900 (epoch 8) loss: 2.620, gen_loss: 15.535, Ret_loss 2.620, FS_loss 23.290, KL_loss: 114730941038906.922, 
	
16340/191900 (epoch 8) loss: 2.620, gen_loss: 15.532, Ret_loss 2.620, FS_loss 23.291, KL_loss: 114152223665532.641, 
	
16345/191900 (epoch 8) loss: 2.621, gen_loss: 15.529, Ret_loss 2.621, FS_loss 23.293, KL_loss: 113581368437768.891, 
	
16350/191900 (epoch 8) loss: 2.621, gen_loss: 15.526, Ret_loss 2.621, FS_loss 23.294, KL_loss: 113089337694917.953, 
	
16355/191900 (epoch 8) loss: 2.621, gen_loss: 15.522, Ret_loss 2.621, FS_loss 23.295, KL_loss: 112530822677294.531, 
	
16360/191900 (epoch 8) loss: 2.621, gen_loss: 15.520, Ret_loss 2.621, FS_loss 23.296, KL_loss: 112743600826551.312, 
	
16365/191900 (epoch 8) loss: 2.620, gen_loss: 15.517, Ret_loss 2.620, FS_loss 23.293, KL_loss: 112191431218427.078, 
	
16370/191900 (epoch 8) loss: 2.619, gen_loss: 15.518, Ret_loss 2.619, FS_loss 23.294, KL_loss: 111641686645954.578, 
	
16375/191900 (epoch 8) loss: 2.619, gen_loss: 15.519, Ret_loss 2.619, FS_loss 23.295, KL_loss: 111114268264862.625, 
	
16380/191900 (epoch 8) loss: 2.619, gen_loss: 15.519, Ret_loss 2.619, FS_loss 23.295, KL_loss: 110575365121821.734, 
	
16385/191900 (epoch 8) loss: 2.619, gen_loss: 15.519, Ret_loss 2.619, FS_loss 23.294, KL_loss: 113688543588580.391, 
	
16390/191900 (epoch 8) loss: 2.618, gen_loss: 15.520, Ret_loss 2.618, FS_loss 23.295, KL_loss: 113143630959761.500, 
	
16395/191900 (epoch 8) loss: 2.618, gen_loss: 15.522, Ret_loss 2.618, FS_loss 23.298, KL_loss: 112799657940998.500, 
	
16400/191900 (epoch 8) loss: 2.618, gen_loss: 15.523, Ret_loss 2.618, FS_loss 23.299, KL_loss: 112267238246724.703, 
	
16405/191900 (epoch 8) loss: 2.617, gen_loss: 15.524, Ret_loss 2.617, FS_loss 23.299, KL_loss: 111741629261189.219, 
	
16410/191900 (epoch 8) loss: 2.617, gen_loss: 15.526, Ret_loss 2.617, FS_loss 23.301, KL_loss: 111720648388123.203, 
	
16415/191900 (epoch 8) loss: 2.617, gen_loss: 15.527, Ret_loss 2.617, FS_loss 23.303, KL_loss: 111195780346795.906, 
	
16420/191900 (epoch 8) loss: 2.617, gen_loss: 15.526, Ret_loss 2.617, FS_loss 23.302, KL_loss: 110679641197105.938, 
	
16425/191900 (epoch 8) loss: 2.617, gen_loss: 15.523, Ret_loss 2.617, FS_loss 23.299, KL_loss: 110164932260500.375, 
	
16430/191900 (epoch 8) loss: 2.617, gen_loss: 15.521, Ret_loss 2.617, FS_loss 23.301, KL_loss: 298574102003298.812, 
	
16435/191900 (epoch 8) loss: 2.617, gen_loss: 15.518, Ret_loss 2.617, FS_loss 23.300, KL_loss: 297200827675890.438, 
	
16440/191900 (epoch 8) loss: 2.617, gen_loss: 15.514, Ret_loss 2.617, FS_loss 23.298, KL_loss: 295837767522776.625, 
	
16445/191900 (epoch 8) loss: 2.617, gen_loss: 15.509, Ret_loss 2.617, FS_loss 23.297, KL_loss: 294848391340208.562, 
	
16450/191900 (epoch 8) loss: 2.617, gen_loss: 15.509, Ret_loss 2.617, FS_loss 23.301, KL_loss: 293508511979604.438, 
	
16455/191900 (epoch 8) loss: 2.617, gen_loss: 15.507, Ret_loss 2.617, FS_loss 23.302, KL_loss: 292197714534322.688, 
	
16460/191900 (epoch 8) loss: 2.617, gen_loss: 15.505, Ret_loss 2.617, FS_loss 23.302, KL_loss: 293749802989441.125, 
	
16465/191900 (epoch 8) loss: 2.616, gen_loss: 15.503, Ret_loss 2.616, FS_loss 23.301, KL_loss: 292431413462002.812, 
	
16470/191900 (epoch 8) loss: 2.616, gen_loss: 15.500, Ret_loss 2.616, FS_loss 23.301, KL_loss: 291124927050379.188, 
	
16475/191900 (epoch 8) loss: 2.616, gen_loss: 15.495, Ret_loss 2.616, FS_loss 23.299, KL_loss: 289832483046698.500, 
	
16480/191900 (epoch 8) loss: 2.616, gen_loss: 15.493, Ret_loss 2.616, FS_loss 23.300, KL_loss: 288549120241005.188, 
	
16485/191900 (epoch 8) loss: 2.616, gen_loss: 15.489, Ret_loss 2.616, FS_loss 23.299, KL_loss: 287309426238095.250, 
	
16490/191900 (epoch 8) loss: 2.616, gen_loss: 15.487, Ret_loss 2.616, FS_loss 23.301, KL_loss: 286049519243747.312, 
	
16495/191900 (epoch 8) loss: 2.616, gen_loss: 15.485, Ret_loss 2.616, FS_loss 23.303, KL_loss: 284863810538894.875, 
	
16500/191900 (epoch 8) loss: 2.616, gen_loss: 15.479, Ret_loss 2.616, FS_loss 23.300, KL_loss: 283647804851279.000, 
	
16505/191900 (epoch 8) loss: 2.616, gen_loss: 15.476, Ret_loss 2.616, FS_loss 23.300, KL_loss: 282431194639033.125, 
	
16510/191900 (epoch 8) loss: 2.615, gen_loss: 15.472, Ret_loss 2.615, FS_loss 23.301, KL_loss: 281227661190319.500, 
	
16515/191900 (epoch 8) loss: 2.616, gen_loss: 15.469, Ret_loss 2.616, FS_loss 23.302, KL_loss: 280031202510296.969, 
	
16520/191900 (epoch 8) loss: 2.616, gen_loss: 15.466, Ret_loss 2.616, FS_loss 23.304, KL_loss: 278834241086713.312, 
	
16525/191900 (epoch 8) loss: 2.615, gen_loss: 15.462, Ret_loss 2.615, FS_loss 23.304, KL_loss: 277670244473182.312, 
	
16530/191900 (epoch 8) loss: 2.616, gen_loss: 15.459, Ret_loss 2.616, FS_loss 23.307, KL_loss: 276604111560618.562, 
	
16535/191900 (epoch 8) loss: 2.616, gen_loss: 15.456, Ret_loss 2.616, FS_loss 23.308, KL_loss: 275443866685929.188, 
	
16540/191900 (epoch 8) loss: 2.616, gen_loss: 15.452, Ret_loss 2.616, FS_loss 23.306, KL_loss: 274520436487888.531, 
	
16545/191900 (epoch 8) loss: 2.616, gen_loss: 15.448, Ret_loss 2.616, FS_loss 23.306, KL_loss: 273371028303068.938, 
	
16550/191900 (epoch 8) loss: 2.616, gen_loss: 15.445, Ret_loss 2.616, FS_loss 23.308, KL_loss: 272232467373598.000, 
	
16555/191900 (epoch 8) loss: 2.616, gen_loss: 15.442, Ret_loss 2.616, FS_loss 23.307, KL_loss: 271110353136700.906, 
	
16560/191900 (epoch 8) loss: 2.616, gen_loss: 15.439, Ret_loss 2.616, FS_loss 23.308, KL_loss: 269989637182401.844, 
	
16565/191900 (epoch 8) loss: 2.615, gen_loss: 15.437, Ret_loss 2.615, FS_loss 23.308, KL_loss: 271064173458021.750, 
	
16570/191900 (epoch 8) loss: 2.616, gen_loss: 15.436, Ret_loss 2.616, FS_loss 23.309, KL_loss: 269952442301759.750, 
	
16575/191900 (epoch 8) loss: 2.615, gen_loss: 15.431, Ret_loss 2.615, FS_loss 23.308, KL_loss: 269854287216326.812, 
	
16580/191900 (epoch 8) loss: 2.615, gen_loss: 15.429, Ret_loss 2.615, FS_loss 23.308, KL_loss: 268757360833856.469, 
	
16585/191900 (epoch 8) loss: 2.615, gen_loss: 15.427, Ret_loss 2.615, FS_loss 23.310, KL_loss: 267668904142368.062, 
	
16590/191900 (epoch 8) loss: 2.615, gen_loss: 15.424, Ret_loss 2.615, FS_loss 23.309, KL_loss: 267845959230942.219, 
	
16595/191900 (epoch 8) loss: 2.615, gen_loss: 15.421, Ret_loss 2.615, FS_loss 23.311, KL_loss: 266771328822006.625, 
	
16600/191900 (epoch 8) loss: 2.615, gen_loss: 15.417, Ret_loss 2.615, FS_loss 23.312, KL_loss: 265704701233505.875, 
	
16605/191900 (epoch 8) loss: 2.614, gen_loss: 15.411, Ret_loss 2.614, FS_loss 23.309, KL_loss: 265160109158146.562, 
	
16610/191900 (epoch 8) loss: 2.614, gen_loss: 15.408, Ret_loss 2.614, FS_loss 23.308, KL_loss: 264144320024437.438, 
	
16615/191900 (epoch 8) loss: 2.614, gen_loss: 15.404, Ret_loss 2.614, FS_loss 23.309, KL_loss: 263237320165493.969, 
	
16620/191900 (epoch 8) loss: 2.614, gen_loss: 15.401, Ret_loss 2.614, FS_loss 23.310, KL_loss: 262205588585257.875, 
	
16625/191900 (epoch 8) loss: 2.614, gen_loss: 15.396, Ret_loss 2.614, FS_loss 23.310, KL_loss: 261178003896967.531, 
	
16630/191900 (epoch 8) loss: 2.614, gen_loss: 15.393, Ret_loss 2.614, FS_loss 23.311, KL_loss: 260166066030902.344, 
	
16635/191900 (epoch 8) loss: 2.613, gen_loss: 15.388, Ret_loss 2.613, FS_loss 23.310, KL_loss: 260020789735441.250, 
	
16640/191900 (epoch 8) loss: 2.613, gen_loss: 15.386, Ret_loss 2.613, FS_loss 23.312, KL_loss: 259012372633291.469, 
	
16645/191900 (epoch 8) loss: 2.613, gen_loss: 15.385, Ret_loss 2.613, FS_loss 23.314, KL_loss: 258019326364538.750, 
	
16650/191900 (epoch 8) loss: 2.613, gen_loss: 15.383, Ret_loss 2.613, FS_loss 23.313, KL_loss: 257033590541646.719, 
	
16655/191900 (epoch 8) loss: 2.613, gen_loss: 15.382, Ret_loss 2.613, FS_loss 23.315, KL_loss: 256050711285371.781, 
	
16660/191900 (epoch 8) loss: 2.613, gen_loss: 15.379, Ret_loss 2.613, FS_loss 23.317, KL_loss: 255462318037508.000, 
	
16665/191900 (epoch 8) loss: 2.613, gen_loss: 15.376, Ret_loss 2.613, FS_loss 23.317, KL_loss: 254491960384440.000, 
	
16670/191900 (epoch 8) loss: 2.613, gen_loss: 15.374, Ret_loss 2.613, FS_loss 23.320, KL_loss: 253574490388206.438, 
	
16675/191900 (epoch 8) loss: 2.612, gen_loss: 15.373, Ret_loss 2.612, FS_loss 23.322, KL_loss: 252617438204950.906, 
	
16680/191900 (epoch 8) loss: 2.612, gen_loss: 15.370, Ret_loss 2.612, FS_loss 23.323, KL_loss: 251813877027929.875, 
	
16685/191900 (epoch 8) loss: 2.612, gen_loss: 15.369, Ret_loss 2.612, FS_loss 23.326, KL_loss: 250875333220663.375, 
	
16690/191900 (epoch 8) loss: 2.612, gen_loss: 15.365, Ret_loss 2.612, FS_loss 23.325, KL_loss: 249939546453893.344, 
	
16695/191900 (epoch 8) loss: 2.612, gen_loss: 15.362, Ret_loss 2.612, FS_loss 23.325, KL_loss: 249099182356280.094, 
	
16700/191900 (epoch 8) loss: 2.612, gen_loss: 15.364, Ret_loss 2.612, FS_loss 23.326, KL_loss: 248179773189899.281, 
	
16705/191900 (epoch 8) loss: 2.612, gen_loss: 15.367, Ret_loss 2.612, FS_loss 23.327, KL_loss: 247268193813685.219, 
	
16710/191900 (epoch 8) loss: 2.612, gen_loss: 15.370, Ret_loss 2.612, FS_loss 23.328, KL_loss: 246466976055869.875, 
	
16715/191900 (epoch 8) loss: 2.611, gen_loss: 15.373, Ret_loss 2.611, FS_loss 23.328, KL_loss: 245565298631540.094, 
	
16720/191900 (epoch 8) loss: 2.611, gen_loss: 15.377, Ret_loss 2.611, FS_loss 23.332, KL_loss: 244765642258225.281, 
	
16725/191900 (epoch 8) loss: 2.611, gen_loss: 15.380, Ret_loss 2.611, FS_loss 23.331, KL_loss: 243876270198832.906, 
	
16730/191900 (epoch 8) loss: 2.611, gen_loss: 15.384, Ret_loss 2.611, FS_loss 23.333, KL_loss: 243004935178218.938, 
	
16735/191900 (epoch 8) loss: 2.611, gen_loss: 15.387, Ret_loss 2.611, FS_loss 23.335, KL_loss: 242131359695411.500, 
	
16740/191900 (epoch 8) loss: 2.611, gen_loss: 15.390, Ret_loss 2.611, FS_loss 23.335, KL_loss: 241261594442438.406, 
	
16745/191900 (epoch 8) loss: 2.611, gen_loss: 15.393, Ret_loss 2.611, FS_loss 23.336, KL_loss: 240445902450889.000, 
	
16750/191900 (epoch 8) loss: 2.611, gen_loss: 15.395, Ret_loss 2.611, FS_loss 23.335, KL_loss: 239589973475229.656, 
	
16755/191900 (epoch 8) loss: 2.611, gen_loss: 15.398, Ret_loss 2.611, FS_loss 23.336, KL_loss: 238738777838053.469, 
	
16760/191900 (epoch 8) loss: 2.611, gen_loss: 15.401, Ret_loss 2.611, FS_loss 23.338, KL_loss: 238167959849674.844, 
	
16765/191900 (epoch 8) loss: 2.611, gen_loss: 15.404, Ret_loss 2.611, FS_loss 23.339, KL_loss: 237389955921286.781, 
	
16770/191900 (epoch 8) loss: 2.611, gen_loss: 15.407, Ret_loss 2.611, FS_loss 23.340, KL_loss: 237022393715037.000, 
	
16775/191900 (epoch 8) loss: 2.611, gen_loss: 15.409, Ret_loss 2.611, FS_loss 23.339, KL_loss: 236193266365987.688, 
	
16780/191900 (epoch 8) loss: 2.611, gen_loss: 15.410, Ret_loss 2.611, FS_loss 23.338, KL_loss: 235396684899623.688, 
	
16785/191900 (epoch 8) loss: 2.611, gen_loss: 15.412, Ret_loss 2.611, FS_loss 23.338, KL_loss: 234595448519659.750, 
	
16790/191900 (epoch 8) loss: 2.611, gen_loss: 15.415, Ret_loss 2.611, FS_loss 23.339, KL_loss: 233782180962236.844, 
	
16795/191900 (epoch 8) loss: 2.611, gen_loss: 15.418, Ret_loss 2.611, FS_loss 23.341, KL_loss: 233088750717950.312, 
	
16800/191900 (epoch 8) loss: 2.611, gen_loss: 15.421, Ret_loss 2.611, FS_loss 23.342, KL_loss: 232287617135653.188, 
	
16805/191900 (epoch 8) loss: 2.611, gen_loss: 15.425, Ret_loss 2.611, FS_loss 23.345, KL_loss: 231492017957222.906, 
	
16810/191900 (epoch 8) loss: 2.611, gen_loss: 15.426, Ret_loss 2.611, FS_loss 23.344, KL_loss: 230736027530095.844, 
	
16815/191900 (epoch 8) loss: 2.611, gen_loss: 15.429, Ret_loss 2.611, FS_loss 23.346, KL_loss: 229951859735083.094, 
	
16820/191900 (epoch 8) loss: 2.611, gen_loss: 15.431, Ret_loss 2.611, FS_loss 23.345, KL_loss: 229201491020779.531, 
	
16825/191900 (epoch 8) loss: 2.612, gen_loss: 15.435, Ret_loss 2.612, FS_loss 23.347, KL_loss: 228424735653844.656, 
	
16830/191900 (epoch 8) loss: 2.612, gen_loss: 15.438, Ret_loss 2.612, FS_loss 23.348, KL_loss: 227701121850734.000, 
	
16835/191900 (epoch 8) loss: 2.612, gen_loss: 15.442, Ret_loss 2.612, FS_loss 23.349, KL_loss: 226934883791114.094, 
	
16840/191900 (epoch 8) loss: 2.612, gen_loss: 15.446, Ret_loss 2.612, FS_loss 23.351, KL_loss: 226201936291988.281, 
	
16845/191900 (epoch 8) loss: 2.611, gen_loss: 15.448, Ret_loss 2.611, FS_loss 23.352, KL_loss: 225451297042482.469, 
	
16850/191900 (epoch 8) loss: 2.611, gen_loss: 15.451, Ret_loss 2.611, FS_loss 23.352, KL_loss: 224700063239999.094, 
	
16855/191900 (epoch 8) loss: 2.611, gen_loss: 15.455, Ret_loss 2.611, FS_loss 23.355, KL_loss: 224490205894308.500, 
	
16860/191900 (epoch 8) loss: 2.611, gen_loss: 15.459, Ret_loss 2.611, FS_loss 23.357, KL_loss: 223746478307500.094, 
	
16865/191900 (epoch 8) loss: 2.611, gen_loss: 15.462, Ret_loss 2.611, FS_loss 23.358, KL_loss: 223008496202661.125, 
	
16870/191900 (epoch 8) loss: 2.611, gen_loss: 15.466, Ret_loss 2.611, FS_loss 23.360, KL_loss: 222277400112078.531, 
	
16875/191900 (epoch 8) loss: 2.611, gen_loss: 15.468, Ret_loss 2.611, FS_loss 23.361, KL_loss: 221548835327776.688, 
	
16880/191900 (epoch 8) loss: 2.611, gen_loss: 15.474, Ret_loss 2.611, FS_loss 23.365, KL_loss: 220833221612602.000, 
	
16885/191900 (epoch 8) loss: 2.610, gen_loss: 15.476, Ret_loss 2.610, FS_loss 23.365, KL_loss: 220114138094582.406, 
	
16890/191900 (epoch 8) loss: 2.610, gen_loss: 15.479, Ret_loss 2.610, FS_loss 23.366, KL_loss: 219504161675818.656, 
	
16895/191900 (epoch 8) loss: 2.610, gen_loss: 15.482, Ret_loss 2.610, FS_loss 23.368, KL_loss: 218794849519820.031, 
	
16900/191900 (epoch 8) loss: 2.610, gen_loss: 15.484, Ret_loss 2.610, FS_loss 23.368, KL_loss: 218095991810926.969, 
	
16905/191900 (epoch 8) loss: 2.610, gen_loss: 15.487, Ret_loss 2.610, FS_loss 23.368, KL_loss: 217431203555886.531, 
	
16910/191900 (epoch 8) loss: 2.609, gen_loss: 15.490, Ret_loss 2.609, FS_loss 23.369, KL_loss: 216738512158081.312, 
	
16915/191900 (epoch 8) loss: 2.609, gen_loss: 15.493, Ret_loss 2.609, FS_loss 23.372, KL_loss: 216152942907465.094, 
	
16920/191900 (epoch 8) loss: 2.609, gen_loss: 15.496, Ret_loss 2.609, FS_loss 23.373, KL_loss: 215464294953740.312, 
	
16925/191900 (epoch 8) loss: 2.609, gen_loss: 15.498, Ret_loss 2.609, FS_loss 23.373, KL_loss: 214935603192281.375, 
	
16930/191900 (epoch 8) loss: 2.610, gen_loss: 15.499, Ret_loss 2.610, FS_loss 23.373, KL_loss: 214255690152121.219, 
	
16935/191900 (epoch 8) loss: 2.610, gen_loss: 15.502, Ret_loss 2.610, FS_loss 23.373, KL_loss: 213593813147704.656, 
	
16940/191900 (epoch 8) loss: 2.610, gen_loss: 15.506, Ret_loss 2.610, FS_loss 23.374, KL_loss: 212953693318598.094, 
	
16945/191900 (epoch 8) loss: 2.610, gen_loss: 15.509, Ret_loss 2.610, FS_loss 23.374, KL_loss: 219350902084200.156, 
	
16950/191900 (epoch 8) loss: 2.610, gen_loss: 15.513, Ret_loss 2.610, FS_loss 23.376, KL_loss: 218665048963821.031, 
	
16955/191900 (epoch 8) loss: 2.610, gen_loss: 15.516, Ret_loss 2.610, FS_loss 23.377, KL_loss: 217987160438083.438, 
	
16960/191900 (epoch 8) loss: 2.610, gen_loss: 15.522, Ret_loss 2.610, FS_loss 23.381, KL_loss: 217309810310105.562, 
	
16965/191900 (epoch 8) loss: 2.610, gen_loss: 15.526, Ret_loss 2.610, FS_loss 23.384, KL_loss: 216637913975711.969, 
	
16970/191900 (epoch 8) loss: 2.610, gen_loss: 15.529, Ret_loss 2.610, FS_loss 23.385, KL_loss: 215968992634412.344, 
	
16975/191900 (epoch 8) loss: 2.610, gen_loss: 15.532, Ret_loss 2.610, FS_loss 23.386, KL_loss: 215310250918631.188, 
	
16980/191900 (epoch 8) loss: 2.610, gen_loss: 15.535, Ret_loss 2.610, FS_loss 23.386, KL_loss: 214649992121879.344, 
	
16985/191900 (epoch 8) loss: 2.610, gen_loss: 15.538, Ret_loss 2.610, FS_loss 23.389, KL_loss: 214005976170818.500, 
	
16990/191900 (epoch 8) loss: 2.610, gen_loss: 15.543, Ret_loss 2.610, FS_loss 23.392, KL_loss: 213356821506395.750, 
	
16995/191900 (epoch 8) loss: 2.610, gen_loss: 15.548, Ret_loss 2.610, FS_loss 23.395, KL_loss: 212709668513081.062, 
	
17000/191900 (epoch 8) loss: 2.610, gen_loss: 15.550, Ret_loss 2.610, FS_loss 23.395, KL_loss: 212114021729340.625, 
	
17005/191900 (epoch 8) loss: 2.609, gen_loss: 15.552, Ret_loss 2.609, FS_loss 23.395, KL_loss: 211475332872121.812, 
	
17010/191900 (epoch 8) loss: 2.609, gen_loss: 15.556, Ret_loss 2.609, FS_loss 23.397, KL_loss: 210848479730760.594, 
	
17015/191900 (epoch 8) loss: 2.610, gen_loss: 15.558, Ret_loss 2.610, FS_loss 23.398, KL_loss: 210229229365525.312, 
	
17020/191900 (epoch 8) loss: 2.610, gen_loss: 15.560, Ret_loss 2.610, FS_loss 23.398, KL_loss: 209604893628821.312, 
	
17025/191900 (epoch 8) loss: 2.610, gen_loss: 15.564, Ret_loss 2.610, FS_loss 23.400, KL_loss: 209029382895561.344, 
	
17030/191900 (epoch 8) loss: 2.610, gen_loss: 15.567, Ret_loss 2.610, FS_loss 23.402, KL_loss: 208407331670218.875, 
	
17035/191900 (epoch 8) loss: 2.610, gen_loss: 15.571, Ret_loss 2.610, FS_loss 23.405, KL_loss: 207806264666502.750, 
	
17040/191900 (epoch 8) loss: 2.609, gen_loss: 15.576, Ret_loss 2.609, FS_loss 23.408, KL_loss: 207194278428969.469, 
	
17045/191900 (epoch 8) loss: 2.609, gen_loss: 15.580, Ret_loss 2.609, FS_loss 23.410, KL_loss: 207139999776116.750, 
	
17050/191900 (epoch 8) loss: 2.609, gen_loss: 15.583, Ret_loss 2.609, FS_loss 23.412, KL_loss: 206532467602800.625, 
	
17055/191900 (epoch 8) loss: 2.609, gen_loss: 15.585, Ret_loss 2.609, FS_loss 23.412, KL_loss: 205935982086833.062, 
	
17060/191900 (epoch 8) loss: 2.609, gen_loss: 15.587, Ret_loss 2.609, FS_loss 23.413, KL_loss: 205419955222473.250, 
	
17065/191900 (epoch 8) loss: 2.609, gen_loss: 15.590, Ret_loss 2.609, FS_loss 23.414, KL_loss: 204824482483231.438, 
	
17070/191900 (epoch 8) loss: 2.609, gen_loss: 15.593, Ret_loss 2.609, FS_loss 23.416, KL_loss: 204395887681213.500, 
	
17075/191900 (epoch 8) loss: 2.609, gen_loss: 15.598, Ret_loss 2.609, FS_loss 23.420, KL_loss: 203808567377850.281, 
	
17080/191900 (epoch 8) loss: 2.609, gen_loss: 15.600, Ret_loss 2.609, FS_loss 23.421, KL_loss: 203263515670165.906, 
	
17085/191900 (epoch 8) loss: 2.609, gen_loss: 15.603, Ret_loss 2.609, FS_loss 23.422, KL_loss: 202677891083032.875, 
	
17090/191900 (epoch 8) loss: 2.608, gen_loss: 15.606, Ret_loss 2.608, FS_loss 23.424, KL_loss: 205551492045643.594, 
	
17095/191900 (epoch 8) loss: 2.608, gen_loss: 15.610, Ret_loss 2.608, FS_loss 23.426, KL_loss: 204965465253866.062, 
	
17100/191900 (epoch 8) loss: 2.608, gen_loss: 15.612, Ret_loss 2.608, FS_loss 23.427, KL_loss: 204382303508506.125, 
	
17105/191900 (epoch 8) loss: 2.607, gen_loss: 15.615, Ret_loss 2.607, FS_loss 23.429, KL_loss: 204888261207722.250, 
	
17110/191900 (epoch 8) loss: 2.607, gen_loss: 15.617, Ret_loss 2.607, FS_loss 23.430, KL_loss: 204308248890739.188, 
	
17115/191900 (epoch 8) loss: 2.607, gen_loss: 15.620, Ret_loss 2.607, FS_loss 23.431, KL_loss: 203742925841216.812, 
	
17120/191900 (epoch 8) loss: 2.607, gen_loss: 15.624, Ret_loss 2.607, FS_loss 23.433, KL_loss: 203167546948860.156, 
	
17125/191900 (epoch 8) loss: 2.606, gen_loss: 15.627, Ret_loss 2.606, FS_loss 23.435, KL_loss: 202628763831785.844, 
	
17130/191900 (epoch 8) loss: 2.606, gen_loss: 15.630, Ret_loss 2.606, FS_loss 23.436, KL_loss: 202069260283788.094, 
	
17135/191900 (epoch 8) loss: 2.606, gen_loss: 15.633, Ret_loss 2.606, FS_loss 23.438, KL_loss: 201531523662270.938, 
	
17140/191900 (epoch 8) loss: 2.606, gen_loss: 15.637, Ret_loss 2.606, FS_loss 23.440, KL_loss: 200969402813167.344, 
	
17145/191900 (epoch 8) loss: 2.606, gen_loss: 15.640, Ret_loss 2.606, FS_loss 23.442, KL_loss: 200430833156293.844, 
	
17150/191900 (epoch 8) loss: 2.606, gen_loss: 15.642, Ret_loss 2.606, FS_loss 23.443, KL_loss: 199874576669145.938, 
	
17155/191900 (epoch 8) loss: 2.606, gen_loss: 15.646, Ret_loss 2.606, FS_loss 23.445, KL_loss: 199684137882060.125, 
	
17160/191900 (epoch 8) loss: 2.606, gen_loss: 15.648, Ret_loss 2.606, FS_loss 23.446, KL_loss: 199132440772983.094, 
	
17165/191900 (epoch 8) loss: 2.606, gen_loss: 15.651, Ret_loss 2.606, FS_loss 23.448, KL_loss: 198586643334564.344, 
	
17170/191900 (epoch 8) loss: 2.606, gen_loss: 15.654, Ret_loss 2.606, FS_loss 23.450, KL_loss: 218512657670061.906, 
	
17175/191900 (epoch 8) loss: 2.606, gen_loss: 15.657, Ret_loss 2.606, FS_loss 23.450, KL_loss: 217913666485509.750, 
	
17180/191900 (epoch 8) loss: 2.605, gen_loss: 15.661, Ret_loss 2.605, FS_loss 23.453, KL_loss: 217319100657501.094, 
	
17185/191900 (epoch 8) loss: 2.605, gen_loss: 15.663, Ret_loss 2.605, FS_loss 23.455, KL_loss: 216726631952247.688, 
	
17190/191900 (epoch 8) loss: 2.605, gen_loss: 15.666, Ret_loss 2.605, FS_loss 23.456, KL_loss: 216137480285993.000, 
	
17195/191900 (epoch 8) loss: 2.605, gen_loss: 15.669, Ret_loss 2.605, FS_loss 23.458, KL_loss: 215551602070395.219, 
	
17200/191900 (epoch 8) loss: 2.604, gen_loss: 15.672, Ret_loss 2.604, FS_loss 23.460, KL_loss: 214968832132715.375, 
	
17205/191900 (epoch 8) loss: 2.605, gen_loss: 15.674, Ret_loss 2.605, FS_loss 23.461, KL_loss: 214858578179846.000, 
	
17210/191900 (epoch 8) loss: 2.605, gen_loss: 15.678, Ret_loss 2.605, FS_loss 23.464, KL_loss: 214280744470465.406, 
	
17215/191900 (epoch 8) loss: 2.605, gen_loss: 15.681, Ret_loss 2.605, FS_loss 23.467, KL_loss: 213817751546080.344, 
	
17220/191900 (epoch 8) loss: 2.605, gen_loss: 15.684, Ret_loss 2.605, FS_loss 23.469, KL_loss: 213246028897030.906, 
	
17225/191900 (epoch 8) loss: 2.605, gen_loss: 15.686, Ret_loss 2.605, FS_loss 23.471, KL_loss: 212677620608904.000, 
	
17230/191900 (epoch 8) loss: 2.605, gen_loss: 15.690, Ret_loss 2.605, FS_loss 23.473, KL_loss: 212366743092225.844, 
	
17235/191900 (epoch 8) loss: 2.605, gen_loss: 15.692, Ret_loss 2.605, FS_loss 23.474, KL_loss: 211808150934728.219, 
	
17240/191900 (epoch 8) loss: 2.604, gen_loss: 15.696, Ret_loss 2.604, FS_loss 23.477, KL_loss: 211256673881804.312, 
	
17245/191900 (epoch 8) loss: 2.604, gen_loss: 15.698, Ret_loss 2.604, FS_loss 23.478, KL_loss: 211665252422469.125, 
	
17250/191900 (epoch 8) loss: 2.604, gen_loss: 15.702, Ret_loss 2.604, FS_loss 23.481, KL_loss: 211108062633047.031, 
	
17255/191900 (epoch 8) loss: 2.604, gen_loss: 15.704, Ret_loss 2.604, FS_loss 23.483, KL_loss: 210557585501604.781, 
	
17260/191900 (epoch 8) loss: 2.604, gen_loss: 15.707, Ret_loss 2.604, FS_loss 23.484, KL_loss: 210006298064192.438, 
	
17265/191900 (epoch 8) loss: 2.604, gen_loss: 15.711, Ret_loss 2.604, FS_loss 23.487, KL_loss: 209575054822079.188, 
	
17270/191900 (epoch 8) loss: 2.604, gen_loss: 15.716, Ret_loss 2.604, FS_loss 23.491, KL_loss: 209031557264949.281, 
	
17275/191900 (epoch 9) loss: 2.557, gen_loss: 16.869, Ret_loss 2.557, FS_loss 24.480, KL_loss: 577535449497.600, 
	
17280/191900 (epoch 9) loss: 2.528, gen_loss: 16.861, Ret_loss 2.528, FS_loss 24.412, KL_loss: 7321291010867.200, 
	
17285/191900 (epoch 9) loss: 2.560, gen_loss: 16.823, Ret_loss 2.560, FS_loss 24.260, KL_loss: 5155458270276.267, 
	
17290/191900 (epoch 9) loss: 2.575, gen_loss: 16.972, Ret_loss 2.575, FS_loss 24.438, KL_loss: 5513742332723.200, 
	
17295/191900 (epoch 9) loss: 2.569, gen_loss: 16.914, Ret_loss 2.569, FS_loss 24.315, KL_loss: 70644230887833.594, 
	
17300/191900 (epoch 9) loss: 2.564, gen_loss: 16.870, Ret_loss 2.564, FS_loss 24.260, KL_loss: 59047812237448.531, 
	
17305/191900 (epoch 9) loss: 2.567, gen_loss: 16.869, Ret_loss 2.567, FS_loss 24.249, KL_loss: 53875509252213.031, 
	
17310/191900 (epoch 9) loss: 2.552, gen_loss: 16.860, Ret_loss 2.552, FS_loss 24.200, KL_loss: 47223543156326.398, 
	
17315/191900 (epoch 9) loss: 2.562, gen_loss: 16.872, Ret_loss 2.562, FS_loss 24.231, KL_loss: 42112920934809.602, 
	
17320/191900 (epoch 9) loss: 2.575, gen_loss: 16.841, Ret_loss 2.575, FS_loss 24.193, KL_loss: 38637805985792.000, 
	
17325/191900 (epoch 9) loss: 2.577, gen_loss: 16.819, Ret_loss 2.577, FS_loss 24.139, KL_loss: 35226663794352.875, 
	
17330/191900 (epoch 9) loss: 2.587, gen_loss: 16.793, Ret_loss 2.587, FS_loss 24.107, KL_loss: 34662693243835.734, 
	
17335/191900 (epoch 9) loss: 2.581, gen_loss: 16.786, Ret_loss 2.581, FS_loss 24.097, KL_loss: 32012750717936.246, 
	
17340/191900 (epoch 9) loss: 2.580, gen_loss: 16.783, Ret_loss 2.580, FS_loss 24.085, KL_loss: 29830654223038.172, 
	
17345/191900 (epoch 9) loss: 2.574, gen_loss: 16.756, Ret_loss 2.574, FS_loss 24.047, KL_loss: 31526419575603.199, 
	
17350/191900 (epoch 9) loss: 2.577, gen_loss: 16.778, Ret_loss 2.577, FS_loss 24.069, KL_loss: 29610939070054.398, 
	
17355/191900 (epoch 9) loss: 2.578, gen_loss: 16.763, Ret_loss 2.578, FS_loss 24.048, KL_loss: 54901577898586.352, 
	
17360/191900 (epoch 9) loss: 2.579, gen_loss: 16.758, Ret_loss 2.579, FS_loss 24.048, KL_loss: 51858360935401.242, 
	
17365/191900 (epoch 9) loss: 2.573, gen_loss: 16.747, Ret_loss 2.573, FS_loss 24.058, KL_loss: 49133434467511.242, 
	
17370/191900 (epoch 9) loss: 2.571, gen_loss: 16.737, Ret_loss 2.571, FS_loss 24.063, KL_loss: 46801078557859.844, 
	
17375/191900 (epoch 9) loss: 2.569, gen_loss: 16.738, Ret_loss 2.569, FS_loss 24.057, KL_loss: 44578512018246.703, 
	
17380/191900 (epoch 9) loss: 2.571, gen_loss: 16.750, Ret_loss 2.571, FS_loss 24.065, KL_loss: 42766707039027.203, 
	
17385/191900 (epoch 9) loss: 2.572, gen_loss: 16.757, Ret_loss 2.572, FS_loss 24.083, KL_loss: 40918678164168.352, 
	
17390/191900 (epoch 9) loss: 2.576, gen_loss: 16.755, Ret_loss 2.576, FS_loss 24.092, KL_loss: 39268077827652.266, 
	
17395/191900 (epoch 9) loss: 2.581, gen_loss: 16.749, Ret_loss 2.581, FS_loss 24.092, KL_loss: 38110197742010.367, 
	
17400/191900 (epoch 9) loss: 2.582, gen_loss: 16.744, Ret_loss 2.582, FS_loss 24.085, KL_loss: 36651755809839.258, 
	
17405/191900 (epoch 9) loss: 2.580, gen_loss: 16.741, Ret_loss 2.580, FS_loss 24.082, KL_loss: 35691875836662.516, 
	
17410/191900 (epoch 9) loss: 2.581, gen_loss: 16.736, Ret_loss 2.581, FS_loss 24.078, KL_loss: 34436289873949.258, 
	
17415/191900 (epoch 9) loss: 2.583, gen_loss: 16.747, Ret_loss 2.583, FS_loss 24.102, KL_loss: 33290028773376.000, 
	
17420/191900 (epoch 9) loss: 2.578, gen_loss: 16.732, Ret_loss 2.578, FS_loss 24.091, KL_loss: 32637056859695.785, 
	
17425/191900 (epoch 9) loss: 2.578, gen_loss: 16.739, Ret_loss 2.578, FS_loss 24.113, KL_loss: 31590540041473.652, 
	
17430/191900 (epoch 9) loss: 2.580, gen_loss: 16.743, Ret_loss 2.580, FS_loss 24.128, KL_loss: 106527022004556.797, 
	
17435/191900 (epoch 9) loss: 2.580, gen_loss: 16.730, Ret_loss 2.580, FS_loss 24.122, KL_loss: 103309443996380.312, 
	
17440/191900 (epoch 9) loss: 2.577, gen_loss: 16.726, Ret_loss 2.577, FS_loss 24.117, KL_loss: 100557908047341.922, 
	
17445/191900 (epoch 9) loss: 2.576, gen_loss: 16.737, Ret_loss 2.576, FS_loss 24.142, KL_loss: 97700688330307.297, 
	
17450/191900 (epoch 9) loss: 2.577, gen_loss: 16.734, Ret_loss 2.577, FS_loss 24.138, KL_loss: 95001942600658.484, 
	
17455/191900 (epoch 9) loss: 2.573, gen_loss: 16.744, Ret_loss 2.573, FS_loss 24.161, KL_loss: 93398338734622.438, 
	
17460/191900 (epoch 9) loss: 2.571, gen_loss: 16.743, Ret_loss 2.571, FS_loss 24.166, KL_loss: 90968420822069.891, 
	
17465/191900 (epoch 9) loss: 2.570, gen_loss: 16.744, Ret_loss 2.570, FS_loss 24.168, KL_loss: 117112509999193.266, 
	
17470/191900 (epoch 9) loss: 2.568, gen_loss: 16.749, Ret_loss 2.568, FS_loss 24.181, KL_loss: 114184731160416.953, 
	
17475/191900 (epoch 9) loss: 2.570, gen_loss: 16.750, Ret_loss 2.570, FS_loss 24.185, KL_loss: 111399822288982.484, 
	
17480/191900 (epoch 9) loss: 2.570, gen_loss: 16.754, Ret_loss 2.570, FS_loss 24.191, KL_loss: 108748711542986.672, 
	
17485/191900 (epoch 9) loss: 2.569, gen_loss: 16.758, Ret_loss 2.569, FS_loss 24.201, KL_loss: 106219758854652.719, 
	
17490/191900 (epoch 9) loss: 2.567, gen_loss: 16.763, Ret_loss 2.567, FS_loss 24.213, KL_loss: 103968267950665.594, 
	
17495/191900 (epoch 9) loss: 2.568, gen_loss: 16.764, Ret_loss 2.568, FS_loss 24.218, KL_loss: 101659375494320.641, 
	
17500/191900 (epoch 9) loss: 2.567, gen_loss: 16.769, Ret_loss 2.567, FS_loss 24.227, KL_loss: 99454408680758.812, 
	
17505/191900 (epoch 9) loss: 2.570, gen_loss: 16.760, Ret_loss 2.570, FS_loss 24.225, KL_loss: 97361861872129.359, 
	
17510/191900 (epoch 9) loss: 2.569, gen_loss: 16.752, Ret_loss 2.569, FS_loss 24.230, KL_loss: 95334584855039.203, 
	
17515/191900 (epoch 9) loss: 2.567, gen_loss: 16.750, Ret_loss 2.567, FS_loss 24.239, KL_loss: 93485984530330.906, 
	
17520/191900 (epoch 9) loss: 2.565, gen_loss: 16.748, Ret_loss 2.565, FS_loss 24.248, KL_loss: 91617718103948.547, 
	
17525/191900 (epoch 9) loss: 2.564, gen_loss: 16.739, Ret_loss 2.564, FS_loss 24.252, KL_loss: 89843386290400.125, 
	
17530/191900 (epoch 9) loss: 2.562, gen_loss: 16.728, Ret_loss 2.562, FS_loss 24.248, KL_loss: 88146335711341.531, 
	
17535/191900 (epoch 9) loss: 2.563, gen_loss: 16.717, Ret_loss 2.563, FS_loss 24.249, KL_loss: 86486332849479.734, 
	
17540/191900 (epoch 9) loss: 2.562, gen_loss: 16.712, Ret_loss 2.562, FS_loss 24.253, KL_loss: 85083452082418.016, 
	
17545/191900 (epoch 9) loss: 2.561, gen_loss: 16.702, Ret_loss 2.561, FS_loss 24.254, KL_loss: 83544773130008.438, 
	
17550/191900 (epoch 9) loss: 2.560, gen_loss: 16.696, Ret_loss 2.560, FS_loss 24.261, KL_loss: 82107113588311.078, 
	
17555/191900 (epoch 9) loss: 2.561, gen_loss: 16.681, Ret_loss 2.561, FS_loss 24.255, KL_loss: 80750445613831.406, 
	
17560/191900 (epoch 9) loss: 2.559, gen_loss: 16.676, Ret_loss 2.559, FS_loss 24.267, KL_loss: 79372260404922.484, 
	
17565/191900 (epoch 9) loss: 2.561, gen_loss: 16.669, Ret_loss 2.561, FS_loss 24.270, KL_loss: 98721808677918.594, 
	
17570/191900 (epoch 9) loss: 2.564, gen_loss: 16.659, Ret_loss 2.564, FS_loss 24.274, KL_loss: 97076607617130.875, 
	
17575/191900 (epoch 9) loss: 2.567, gen_loss: 16.658, Ret_loss 2.567, FS_loss 24.282, KL_loss: 95500186936703.797, 
	
17580/191900 (epoch 9) loss: 2.565, gen_loss: 16.650, Ret_loss 2.565, FS_loss 24.284, KL_loss: 93960885631825.969, 
	
17585/191900 (epoch 9) loss: 2.565, gen_loss: 16.640, Ret_loss 2.565, FS_loss 24.283, KL_loss: 92469915506783.281, 
	
17590/191900 (epoch 9) loss: 2.563, gen_loss: 16.640, Ret_loss 2.563, FS_loss 24.296, KL_loss: 91588296696343.406, 
	
17595/191900 (epoch 9) loss: 2.562, gen_loss: 16.632, Ret_loss 2.562, FS_loss 24.298, KL_loss: 90217077328418.062, 
	
17600/191900 (epoch 9) loss: 2.564, gen_loss: 16.617, Ret_loss 2.564, FS_loss 24.292, KL_loss: 88972004405196.219, 
	
17605/191900 (epoch 9) loss: 2.562, gen_loss: 16.602, Ret_loss 2.562, FS_loss 24.287, KL_loss: 87664742008175.766, 
	
17610/191900 (epoch 9) loss: 2.563, gen_loss: 16.590, Ret_loss 2.563, FS_loss 24.288, KL_loss: 86386410278885.828, 
	
17615/191900 (epoch 9) loss: 2.564, gen_loss: 16.574, Ret_loss 2.564, FS_loss 24.297, KL_loss: 85327578658986.109, 
	
17620/191900 (epoch 9) loss: 2.566, gen_loss: 16.553, Ret_loss 2.566, FS_loss 24.306, KL_loss: 86648081081979.797, 
	
17625/191900 (epoch 9) loss: 2.565, gen_loss: 16.528, Ret_loss 2.565, FS_loss 24.315, KL_loss: 85428215717816.781, 
	
17630/191900 (epoch 9) loss: 2.567, gen_loss: 16.493, Ret_loss 2.567, FS_loss 24.309, KL_loss: 84242852433588.094, 
	
17635/191900 (epoch 9) loss: 2.565, gen_loss: 16.461, Ret_loss 2.565, FS_loss 24.311, KL_loss: 83104933990802.062, 
	
17640/191900 (epoch 9) loss: 2.564, gen_loss: 16.433, Ret_loss 2.564, FS_loss 24.311, KL_loss: 81982749675296.688, 
	
17645/191900 (epoch 9) loss: 2.563, gen_loss: 16.411, Ret_loss 2.563, FS_loss 24.316, KL_loss: 82007006341298.344, 
	
17650/191900 (epoch 9) loss: 2.563, gen_loss: 16.387, Ret_loss 2.563, FS_loss 24.314, KL_loss: 81235777813556.047, 
	
17655/191900 (epoch 9) loss: 2.562, gen_loss: 16.365, Ret_loss 2.562, FS_loss 24.311, KL_loss: 80182920267960.359, 
	
17660/191900 (epoch 9) loss: 2.562, gen_loss: 16.350, Ret_loss 2.562, FS_loss 24.319, KL_loss: 79164399270442.828, 
	
17665/191900 (epoch 9) loss: 2.563, gen_loss: 16.331, Ret_loss 2.563, FS_loss 24.319, KL_loss: 80576708279426.438, 
	
17670/191900 (epoch 9) loss: 2.564, gen_loss: 16.310, Ret_loss 2.564, FS_loss 24.314, KL_loss: 79588095023286.562, 
	
17675/191900 (epoch 9) loss: 2.563, gen_loss: 16.295, Ret_loss 2.563, FS_loss 24.318, KL_loss: 78673622824922.859, 
	
17680/191900 (epoch 9) loss: 2.562, gen_loss: 16.277, Ret_loss 2.562, FS_loss 24.318, KL_loss: 77723736555538.266, 
	
17685/191900 (epoch 9) loss: 2.561, gen_loss: 16.263, Ret_loss 2.561, FS_loss 24.322, KL_loss: 76816246772134.703, 
	
17690/191900 (epoch 9) loss: 2.561, gen_loss: 16.245, Ret_loss 2.561, FS_loss 24.321, KL_loss: 76195937618698.516, 
	
17695/191900 (epoch 9) loss: 2.559, gen_loss: 16.230, Ret_loss 2.559, FS_loss 24.325, KL_loss: 75303773896336.109, 
	
17700/191900 (epoch 9) loss: 2.558, gen_loss: 16.212, Ret_loss 2.558, FS_loss 24.324, KL_loss: 74484158026907.531, 
	
17705/191900 (epoch 9) loss: 2.558, gen_loss: 16.197, Ret_loss 2.558, FS_loss 24.323, KL_loss: 73631179791704.422, 
	
17710/191900 (epoch 9) loss: 2.558, gen_loss: 16.183, Ret_loss 2.558, FS_loss 24.326, KL_loss: 72809729502876.656, 
	
17715/191900 (epoch 9) loss: 2.560, gen_loss: 16.168, Ret_loss 2.560, FS_loss 24.326, KL_loss: 72074840682963.844, 
	
17720/191900 (epoch 9) loss: 2.560, gen_loss: 16.151, Ret_loss 2.560, FS_loss 24.321, KL_loss: 71284084524699.453, 
	
17725/191900 (epoch 9) loss: 2.560, gen_loss: 16.135, Ret_loss 2.560, FS_loss 24.320, KL_loss: 70643436158704.391, 
	
17730/191900 (epoch 9) loss: 2.560, gen_loss: 16.125, Ret_loss 2.560, FS_loss 24.329, KL_loss: 69877131578482.227, 
	
17735/191900 (epoch 9) loss: 2.559, gen_loss: 16.112, Ret_loss 2.559, FS_loss 24.330, KL_loss: 69194218397800.188, 
	
17740/191900 (epoch 9) loss: 2.560, gen_loss: 16.094, Ret_loss 2.560, FS_loss 24.325, KL_loss: 68474982624511.594, 
	
17745/191900 (epoch 9) loss: 2.559, gen_loss: 16.081, Ret_loss 2.559, FS_loss 24.327, KL_loss: 67762401576652.398, 
	
17750/191900 (epoch 9) loss: 2.559, gen_loss: 16.063, Ret_loss 2.559, FS_loss 24.324, KL_loss: 85963494577031.062, 
	
17755/191900 (epoch 9) loss: 2.559, gen_loss: 16.049, Ret_loss 2.559, FS_loss 24.324, KL_loss: 89482344682517.766, 
	
17760/191900 (epoch 9) loss: 2.558, gen_loss: 16.037, Ret_loss 2.558, FS_loss 24.326, KL_loss: 88569631679453.125, 
	
17765/191900 (epoch 9) loss: 2.559, gen_loss: 16.021, Ret_loss 2.559, FS_loss 24.323, KL_loss: 87769130315489.094, 
	
17770/191900 (epoch 9) loss: 2.559, gen_loss: 16.006, Ret_loss 2.559, FS_loss 24.324, KL_loss: 86896291607104.125, 
	
17775/191900 (epoch 9) loss: 2.558, gen_loss: 15.988, Ret_loss 2.558, FS_loss 24.321, KL_loss: 86037358601411.297, 
	
17780/191900 (epoch 9) loss: 2.557, gen_loss: 15.974, Ret_loss 2.557, FS_loss 24.326, KL_loss: 85904267982874.734, 
	
17785/191900 (epoch 9) loss: 2.557, gen_loss: 15.957, Ret_loss 2.557, FS_loss 24.326, KL_loss: 85079604123042.172, 
	
17790/191900 (epoch 9) loss: 2.556, gen_loss: 15.943, Ret_loss 2.556, FS_loss 24.329, KL_loss: 84572974306322.344, 
	
17795/191900 (epoch 9) loss: 2.555, gen_loss: 15.926, Ret_loss 2.555, FS_loss 24.328, KL_loss: 83861590192294.406, 
	
17800/191900 (epoch 9) loss: 2.555, gen_loss: 15.911, Ret_loss 2.555, FS_loss 24.327, KL_loss: 83441282167698.469, 
	
17805/191900 (epoch 9) loss: 2.554, gen_loss: 15.896, Ret_loss 2.554, FS_loss 24.328, KL_loss: 82661704712160.062, 
	
17810/191900 (epoch 9) loss: 2.554, gen_loss: 15.881, Ret_loss 2.554, FS_loss 24.330, KL_loss: 81896696971073.062, 
	
17815/191900 (epoch 9) loss: 2.554, gen_loss: 15.867, Ret_loss 2.554, FS_loss 24.331, KL_loss: 81159317086875.594, 
	
17820/191900 (epoch 9) loss: 2.554, gen_loss: 15.855, Ret_loss 2.554, FS_loss 24.332, KL_loss: 80422401729665.047, 
	
17825/191900 (epoch 9) loss: 2.555, gen_loss: 15.845, Ret_loss 2.555, FS_loss 24.338, KL_loss: 81176699281118.906, 
	
17830/191900 (epoch 9) loss: 2.554, gen_loss: 15.831, Ret_loss 2.554, FS_loss 24.334, KL_loss: 80457929231907.312, 
	
17835/191900 (epoch 9) loss: 2.555, gen_loss: 15.818, Ret_loss 2.555, FS_loss 24.335, KL_loss: 79771215607962.625, 
	
17840/191900 (epoch 9) loss: 2.555, gen_loss: 15.805, Ret_loss 2.555, FS_loss 24.335, KL_loss: 81737417102543.156, 
	
17845/191900 (epoch 9) loss: 2.555, gen_loss: 15.797, Ret_loss 2.555, FS_loss 24.345, KL_loss: 81027158174969.875, 
	
17850/191900 (epoch 9) loss: 2.554, gen_loss: 15.785, Ret_loss 2.554, FS_loss 24.346, KL_loss: 80349498040972.031, 
	
17855/191900 (epoch 9) loss: 2.553, gen_loss: 15.774, Ret_loss 2.553, FS_loss 24.347, KL_loss: 79664973344539.234, 
	
17860/191900 (epoch 9) loss: 2.554, gen_loss: 15.762, Ret_loss 2.554, FS_loss 24.350, KL_loss: 79059343690001.031, 
	
17865/191900 (epoch 9) loss: 2.554, gen_loss: 15.749, Ret_loss 2.554, FS_loss 24.349, KL_loss: 78405629966444.969, 
	
17870/191900 (epoch 9) loss: 2.554, gen_loss: 15.737, Ret_loss 2.554, FS_loss 24.353, KL_loss: 78675402468272.312, 
	
17875/191900 (epoch 9) loss: 2.554, gen_loss: 15.723, Ret_loss 2.554, FS_loss 24.351, KL_loss: 78027189708027.031, 
	
17880/191900 (epoch 9) loss: 2.555, gen_loss: 15.711, Ret_loss 2.555, FS_loss 24.353, KL_loss: 77423496527565.328, 
	
17885/191900 (epoch 9) loss: 2.555, gen_loss: 15.699, Ret_loss 2.555, FS_loss 24.356, KL_loss: 76797392332645.672, 
	
17890/191900 (epoch 9) loss: 2.554, gen_loss: 15.687, Ret_loss 2.554, FS_loss 24.356, KL_loss: 76276423312379.562, 
	
17895/191900 (epoch 9) loss: 2.554, gen_loss: 15.675, Ret_loss 2.554, FS_loss 24.354, KL_loss: 75669745451547.547, 
	
17900/191900 (epoch 9) loss: 2.554, gen_loss: 15.663, Ret_loss 2.554, FS_loss 24.354, KL_loss: 75074961270025.453, 
	
17905/191900 (epoch 9) loss: 2.553, gen_loss: 15.650, Ret_loss 2.553, FS_loss 24.350, KL_loss: 74564364204598.531, 
	
17910/191900 (epoch 9) loss: 2.553, gen_loss: 15.638, Ret_loss 2.553, FS_loss 24.348, KL_loss: 73986422589352.500, 
	
17915/191900 (epoch 9) loss: 2.554, gen_loss: 15.628, Ret_loss 2.554, FS_loss 24.351, KL_loss: 74837196538175.609, 
	
17920/191900 (epoch 9) loss: 2.554, gen_loss: 15.619, Ret_loss 2.554, FS_loss 24.354, KL_loss: 74270728360694.250, 
	
17925/191900 (epoch 9) loss: 2.553, gen_loss: 15.608, Ret_loss 2.553, FS_loss 24.352, KL_loss: 73790717479154.812, 
	
17930/191900 (epoch 9) loss: 2.553, gen_loss: 15.597, Ret_loss 2.553, FS_loss 24.348, KL_loss: 73281835365185.656, 
	
17935/191900 (epoch 9) loss: 2.552, gen_loss: 15.586, Ret_loss 2.552, FS_loss 24.348, KL_loss: 72735287749025.781, 
	
17940/191900 (epoch 9) loss: 2.552, gen_loss: 15.576, Ret_loss 2.552, FS_loss 24.349, KL_loss: 72224698048599.594, 
	
17945/191900 (epoch 9) loss: 2.552, gen_loss: 15.565, Ret_loss 2.552, FS_loss 24.349, KL_loss: 71693429841824.906, 
	
17950/191900 (epoch 9) loss: 2.552, gen_loss: 15.555, Ret_loss 2.552, FS_loss 24.348, KL_loss: 125404793588738.734, 
	
17955/191900 (epoch 9) loss: 2.552, gen_loss: 15.544, Ret_loss 2.552, FS_loss 24.346, KL_loss: 124489435808058.297, 
	
17960/191900 (epoch 9) loss: 2.552, gen_loss: 15.534, Ret_loss 2.552, FS_loss 24.346, KL_loss: 123587358130626.312, 
	
17965/191900 (epoch 9) loss: 2.551, gen_loss: 15.524, Ret_loss 2.551, FS_loss 24.348, KL_loss: 122698502735756.984, 
	
17970/191900 (epoch 9) loss: 2.551, gen_loss: 15.513, Ret_loss 2.551, FS_loss 24.345, KL_loss: 121822104051438.719, 
	
17975/191900 (epoch 9) loss: 2.550, gen_loss: 15.502, Ret_loss 2.550, FS_loss 24.345, KL_loss: 123250824096487.219, 
	
17980/191900 (epoch 9) loss: 2.550, gen_loss: 15.490, Ret_loss 2.550, FS_loss 24.340, KL_loss: 122383126044638.375, 
	
17985/191900 (epoch 9) loss: 2.549, gen_loss: 15.481, Ret_loss 2.549, FS_loss 24.341, KL_loss: 121527403882378.109, 
	
17990/191900 (epoch 9) loss: 2.549, gen_loss: 15.473, Ret_loss 2.549, FS_loss 24.344, KL_loss: 120690950910298.578, 
	
17995/191900 (epoch 9) loss: 2.549, gen_loss: 15.465, Ret_loss 2.549, FS_loss 24.345, KL_loss: 119859619654538.328, 
	
18000/191900 (epoch 9) loss: 2.550, gen_loss: 15.455, Ret_loss 2.550, FS_loss 24.345, KL_loss: 119039927484185.516, 
	
18005/191900 (epoch 9) loss: 2.550, gen_loss: 15.445, Ret_loss 2.550, FS_loss 24.344, KL_loss: 121625446733113.031, 
	
18010/191900 (epoch 9) loss: 2.549, gen_loss: 15.438, Ret_loss 2.549, FS_loss 24.346, KL_loss: 120804971210247.875, 
	
18015/191900 (epoch 9) loss: 2.550, gen_loss: 15.427, Ret_loss 2.550, FS_loss 24.342, KL_loss: 120663417420146.688, 
	
18020/191900 (epoch 9) loss: 2.549, gen_loss: 15.420, Ret_loss 2.549, FS_loss 24.343, KL_loss: 119908391630836.656, 
	
18025/191900 (epoch 9) loss: 2.550, gen_loss: 15.411, Ret_loss 2.550, FS_loss 24.342, KL_loss: 119460309901186.797, 
	
18030/191900 (epoch 9) loss: 2.550, gen_loss: 15.402, Ret_loss 2.550, FS_loss 24.341, KL_loss: 118678738484078.062, 
	
18035/191900 (epoch 9) loss: 2.550, gen_loss: 15.391, Ret_loss 2.550, FS_loss 24.335, KL_loss: 117906636522772.656, 
	
18040/191900 (epoch 9) loss: 2.550, gen_loss: 15.383, Ret_loss 2.550, FS_loss 24.335, KL_loss: 117217252269244.422, 
	
18045/191900 (epoch 9) loss: 2.550, gen_loss: 15.377, Ret_loss 2.550, FS_loss 24.338, KL_loss: 116462631620353.906, 
	
18050/191900 (epoch 9) loss: 2.549, gen_loss: 15.369, Ret_loss 2.549, FS_loss 24.337, KL_loss: 115784422988894.109, 
	
18055/191900 (epoch 9) loss: 2.550, gen_loss: 15.360, Ret_loss 2.550, FS_loss 24.336, KL_loss: 115068071962876.656, 
	
18060/191900 (epoch 9) loss: 2.549, gen_loss: 15.351, Ret_loss 2.549, FS_loss 24.334, KL_loss: 114359199174992.609, 
	
18065/191900 (epoch 9) loss: 2.549, gen_loss: 15.345, Ret_loss 2.549, FS_loss 24.334, KL_loss: 113825228259343.047, 
	
18070/191900 (epoch 9) loss: 2.549, gen_loss: 15.336, Ret_loss 2.549, FS_loss 24.334, KL_loss: 113115448396835.438, 
	
18075/191900 (epoch 9) loss: 2.549, gen_loss: 15.329, Ret_loss 2.549, FS_loss 24.334, KL_loss: 112604333042714.312, 
	
18080/191900 (epoch 9) loss: 2.549, gen_loss: 15.321, Ret_loss 2.549, FS_loss 24.337, KL_loss: 111910788365824.875, 
	
18085/191900 (epoch 9) loss: 2.550, gen_loss: 15.314, Ret_loss 2.550, FS_loss 24.337, KL_loss: 111230717168336.812, 
	
18090/191900 (epoch 9) loss: 2.551, gen_loss: 15.308, Ret_loss 2.551, FS_loss 24.340, KL_loss: 111306988219466.531, 
	
18095/191900 (epoch 9) loss: 2.551, gen_loss: 15.299, Ret_loss 2.551, FS_loss 24.338, KL_loss: 110632789766118.781, 
	
18100/191900 (epoch 9) loss: 2.552, gen_loss: 15.293, Ret_loss 2.552, FS_loss 24.339, KL_loss: 109987269651058.359, 
	
18105/191900 (epoch 9) loss: 2.552, gen_loss: 15.285, Ret_loss 2.552, FS_loss 24.341, KL_loss: 109331573251997.516, 
	
18110/191900 (epoch 9) loss: 2.552, gen_loss: 15.277, Ret_loss 2.552, FS_loss 24.344, KL_loss: 108689799778976.531, 
	
18115/191900 (epoch 9) loss: 2.552, gen_loss: 15.268, Ret_loss 2.552, FS_loss 24.345, KL_loss: 108272025629558.688, 
	
18120/191900 (epoch 9) loss: 2.552, gen_loss: 15.259, Ret_loss 2.552, FS_loss 24.347, KL_loss: 107641688713933.625, 
	
18125/191900 (epoch 9) loss: 2.552, gen_loss: 15.248, Ret_loss 2.552, FS_loss 24.343, KL_loss: 107015641988918.422, 
	
18130/191900 (epoch 9) loss: 2.552, gen_loss: 15.237, Ret_loss 2.552, FS_loss 24.343, KL_loss: 106571712465581.469, 
	
18135/191900 (epoch 9) loss: 2.551, gen_loss: 15.224, Ret_loss 2.551, FS_loss 24.342, KL_loss: 105959097114225.875, 
	
18140/191900 (epoch 9) loss: 2.551, gen_loss: 15.212, Ret_loss 2.551, FS_loss 24.341, KL_loss: 105355489299199.047, 
	
18145/191900 (epoch 9) loss: 2.552, gen_loss: 15.200, Ret_loss 2.552, FS_loss 24.341, KL_loss: 105082938427094.375, 
	
18150/191900 (epoch 9) loss: 2.552, gen_loss: 15.186, Ret_loss 2.552, FS_loss 24.340, KL_loss: 104487017233584.516, 
	
18155/191900 (epoch 9) loss: 2.552, gen_loss: 15.174, Ret_loss 2.552, FS_loss 24.337, KL_loss: 103899769543074.500, 
	
18160/191900 (epoch 9) loss: 2.552, gen_loss: 15.162, Ret_loss 2.552, FS_loss 24.338, KL_loss: 103421200320608.281, 
	
18165/191900 (epoch 9) loss: 2.552, gen_loss: 15.151, Ret_loss 2.552, FS_loss 24.338, KL_loss: 103037869306500.938, 
	
18170/191900 (epoch 9) loss: 2.553, gen_loss: 15.140, Ret_loss 2.553, FS_loss 24.337, KL_loss: 102468159555874.922, 
	
18175/191900 (epoch 9) loss: 2.553, gen_loss: 15.131, Ret_loss 2.553, FS_loss 24.338, KL_loss: 101905245784034.234, 
	
18180/191900 (epoch 9) loss: 2.553, gen_loss: 15.123, Ret_loss 2.553, FS_loss 24.339, KL_loss: 101546541001239.281, 
	
18185/191900 (epoch 9) loss: 2.553, gen_loss: 15.116, Ret_loss 2.553, FS_loss 24.341, KL_loss: 100992202887763.031, 
	
18190/191900 (epoch 9) loss: 2.552, gen_loss: 15.107, Ret_loss 2.552, FS_loss 24.339, KL_loss: 100443945403983.797, 
	
18195/191900 (epoch 9) loss: 2.552, gen_loss: 15.099, Ret_loss 2.552, FS_loss 24.338, KL_loss: 99965814831039.453, 
	
18200/191900 (epoch 9) loss: 2.552, gen_loss: 15.090, Ret_loss 2.552, FS_loss 24.338, KL_loss: 99429924468030.969, 
	
18205/191900 (epoch 9) loss: 2.551, gen_loss: 15.083, Ret_loss 2.551, FS_loss 24.340, KL_loss: 98982424895369.375, 
	
18210/191900 (epoch 9) loss: 2.551, gen_loss: 15.073, Ret_loss 2.551, FS_loss 24.338, KL_loss: 99853906756476.938, 
	
18215/191900 (epoch 9) loss: 2.552, gen_loss: 15.063, Ret_loss 2.552, FS_loss 24.335, KL_loss: 99325741059120.422, 
	
18220/191900 (epoch 9) loss: 2.552, gen_loss: 15.054, Ret_loss 2.552, FS_loss 24.334, KL_loss: 98847625570139.828, 
	
18225/191900 (epoch 9) loss: 2.552, gen_loss: 15.044, Ret_loss 2.552, FS_loss 24.331, KL_loss: 98331451367968.375, 
	
18230/191900 (epoch 9) loss: 2.551, gen_loss: 15.035, Ret_loss 2.551, FS_loss 24.331, KL_loss: 97819972603323.406, 
	
18235/191900 (epoch 9) loss: 2.551, gen_loss: 15.026, Ret_loss 2.551, FS_loss 24.330, KL_loss: 97382521812781.562, 
	
18240/191900 (epoch 9) loss: 2.552, gen_loss: 15.018, Ret_loss 2.552, FS_loss 24.330, KL_loss: 96882540244831.203, 
	
18245/191900 (epoch 9) loss: 2.551, gen_loss: 15.011, Ret_loss 2.551, FS_loss 24.330, KL_loss: 96467888575644.156, 
	
18250/191900 (epoch 9) loss: 2.551, gen_loss: 15.006, Ret_loss 2.551, FS_loss 24.331, KL_loss: 96003653146732.344, 
	
18255/191900 (epoch 9) loss: 2.550, gen_loss: 15.000, Ret_loss 2.550, FS_loss 24.332, KL_loss: 95517164096674.891, 
	
18260/191900 (epoch 9) loss: 2.551, gen_loss: 14.994, Ret_loss 2.551, FS_loss 24.331, KL_loss: 95097810147927.594, 
	
18265/191900 (epoch 9) loss: 2.551, gen_loss: 14.990, Ret_loss 2.551, FS_loss 24.332, KL_loss: 94625890122203.141, 
	
18270/191900 (epoch 9) loss: 2.552, gen_loss: 14.984, Ret_loss 2.552, FS_loss 24.332, KL_loss: 94154927575948.984, 
	
18275/191900 (epoch 9) loss: 2.553, gen_loss: 14.978, Ret_loss 2.553, FS_loss 24.332, KL_loss: 93749552733620.797, 
	
18280/191900 (epoch 9) loss: 2.553, gen_loss: 14.974, Ret_loss 2.553, FS_loss 24.336, KL_loss: 93286764159275.781, 
	
18285/191900 (epoch 9) loss: 2.552, gen_loss: 14.967, Ret_loss 2.552, FS_loss 24.333, KL_loss: 92830859305686.062, 
	
18290/191900 (epoch 9) loss: 2.552, gen_loss: 14.961, Ret_loss 2.552, FS_loss 24.332, KL_loss: 92429399889084.422, 
	
18295/191900 (epoch 9) loss: 2.552, gen_loss: 14.955, Ret_loss 2.552, FS_loss 24.333, KL_loss: 91981836738064.172, 
	
18300/191900 (epoch 9) loss: 2.552, gen_loss: 14.950, Ret_loss 2.552, FS_loss 24.336, KL_loss: 93927606710907.969, 
	
18305/191900 (epoch 9) loss: 2.551, gen_loss: 14.943, Ret_loss 2.551, FS_loss 24.332, KL_loss: 93476275100318.484, 
	
18310/191900 (epoch 9) loss: 2.551, gen_loss: 14.937, Ret_loss 2.551, FS_loss 24.332, KL_loss: 93036398572945.422, 
	
18315/191900 (epoch 9) loss: 2.551, gen_loss: 14.931, Ret_loss 2.551, FS_loss 24.332, KL_loss: 92700904024524.250, 
	
18320/191900 (epoch 9) loss: 2.551, gen_loss: 14.925, Ret_loss 2.551, FS_loss 24.331, KL_loss: 92260094722632.844, 
	
18325/191900 (epoch 9) loss: 2.551, gen_loss: 14.921, Ret_loss 2.551, FS_loss 24.333, KL_loss: 91858104686574.219, 
	
18330/191900 (epoch 9) loss: 2.551, gen_loss: 14.914, Ret_loss 2.551, FS_loss 24.330, KL_loss: 91427302957959.906, 
	
18335/191900 (epoch 9) loss: 2.551, gen_loss: 14.910, Ret_loss 2.551, FS_loss 24.334, KL_loss: 91004695003727.984, 
	
18340/191900 (epoch 9) loss: 2.551, gen_loss: 14.904, Ret_loss 2.551, FS_loss 24.333, KL_loss: 90627893995316.812, 
	
18345/191900 (epoch 9) loss: 2.551, gen_loss: 14.898, Ret_loss 2.551, FS_loss 24.334, KL_loss: 90207976233346.438, 
	
18350/191900 (epoch 9) loss: 2.551, gen_loss: 14.893, Ret_loss 2.551, FS_loss 24.335, KL_loss: 89823228852701.578, 
	
18355/191900 (epoch 9) loss: 2.552, gen_loss: 14.888, Ret_loss 2.552, FS_loss 24.336, KL_loss: 89410993337539.062, 
	
18360/191900 (epoch 9) loss: 2.552, gen_loss: 14.881, Ret_loss 2.552, FS_loss 24.335, KL_loss: 89111749170684.891, 
	
18365/191900 (epoch 9) loss: 2.552, gen_loss: 14.876, Ret_loss 2.552, FS_loss 24.336, KL_loss: 88908149018260.859, 
	
18370/191900 (epoch 9) loss: 2.552, gen_loss: 14.871, Ret_loss 2.552, FS_loss 24.336, KL_loss: 88505395628970.062, 
	
18375/191900 (epoch 9) loss: 2.551, gen_loss: 14.866, Ret_loss 2.551, FS_loss 24.337, KL_loss: 88108522884634.125, 
	
18380/191900 (epoch 9) loss: 2.552, gen_loss: 14.861, Ret_loss 2.552, FS_loss 24.336, KL_loss: 87775529447718.922, 
	
18385/191900 (epoch 9) loss: 2.551, gen_loss: 14.856, Ret_loss 2.551, FS_loss 24.338, KL_loss: 87387764648356.328, 
	
18390/191900 (epoch 9) loss: 2.551, gen_loss: 14.851, Ret_loss 2.551, FS_loss 24.338, KL_loss: 87049855137213.891, 
	
18395/191900 (epoch 9) loss: 2.551, gen_loss: 14.845, Ret_loss 2.551, FS_loss 24.337, KL_loss: 86686115261892.094, 
	
18400/191900 (epoch 9) loss: 2.550, gen_loss: 14.840, Ret_loss 2.550, FS_loss 24.338, KL_loss: 86303840921023.375, 
	
18405/191900 (epoch 9) loss: 2.550, gen_loss: 14.834, Ret_loss 2.550, FS_loss 24.337, KL_loss: 86008536732120.469, 
	
18410/191900 (epoch 9) loss: 2.550, gen_loss: 14.828, Ret_loss 2.550, FS_loss 24.335, KL_loss: 85631674088361.484, 
	
18415/191900 (epoch 9) loss: 2.550, gen_loss: 14.822, Ret_loss 2.550, FS_loss 24.334, KL_loss: 85437455887768.422, 
	
18420/191900 (epoch 9) loss: 2.551, gen_loss: 14.817, Ret_loss 2.551, FS_loss 24.333, KL_loss: 85081748434021.234, 
	
18425/191900 (epoch 9) loss: 2.551, gen_loss: 14.811, Ret_loss 2.551, FS_loss 24.332, KL_loss: 84714416908590.938, 
	
18430/191900 (epoch 9) loss: 2.551, gen_loss: 14.805, Ret_loss 2.551, FS_loss 24.330, KL_loss: 84358239970229.578, 
	
18435/191900 (epoch 9) loss: 2.551, gen_loss: 14.800, Ret_loss 2.551, FS_loss 24.331, KL_loss: 83999720154223.359, 
	
18440/191900 (epoch 9) loss: 2.551, gen_loss: 14.794, Ret_loss 2.551, FS_loss 24.328, KL_loss: 83667485297269.875, 
	
18445/191900 (epoch 9) loss: 2.550, gen_loss: 14.789, Ret_loss 2.550, FS_loss 24.328, KL_loss: 83388893678395.641, 
	
18450/191900 (epoch 9) loss: 2.550, gen_loss: 14.782, Ret_loss 2.550, FS_loss 24.325, KL_loss: 83041876997682.062, 
	
18455/191900 (epoch 9) loss: 2.549, gen_loss: 14.777, Ret_loss 2.549, FS_loss 24.325, KL_loss: 83793223333782.312, 
	
18460/191900 (epoch 9) loss: 2.550, gen_loss: 14.773, Ret_loss 2.550, FS_loss 24.326, KL_loss: 83444922289538.953, 
	
18465/191900 (epoch 9) loss: 2.550, gen_loss: 14.768, Ret_loss 2.550, FS_loss 24.325, KL_loss: 83099358922612.906, 
	
18470/191900 (epoch 9) loss: 2.549, gen_loss: 14.764, Ret_loss 2.549, FS_loss 24.327, KL_loss: 82974266100875.688, 
	
18475/191900 (epoch 9) loss: 2.549, gen_loss: 14.760, Ret_loss 2.549, FS_loss 24.328, KL_loss: 82631421945408.750, 
	
18480/191900 (epoch 9) loss: 2.549, gen_loss: 14.756, Ret_loss 2.549, FS_loss 24.330, KL_loss: 82293949059515.188, 
	
18485/191900 (epoch 9) loss: 2.549, gen_loss: 14.752, Ret_loss 2.549, FS_loss 24.330, KL_loss: 83097428144373.828, 
	
18490/191900 (epoch 9) loss: 2.548, gen_loss: 14.748, Ret_loss 2.548, FS_loss 24.329, KL_loss: 82757025344201.188, 
	
18495/191900 (epoch 9) loss: 2.548, gen_loss: 14.743, Ret_loss 2.548, FS_loss 24.329, KL_loss: 82427729031888.297, 
	
18500/191900 (epoch 9) loss: 2.548, gen_loss: 14.740, Ret_loss 2.548, FS_loss 24.330, KL_loss: 82093238592115.453, 
	
18505/191900 (epoch 9) loss: 2.548, gen_loss: 14.736, Ret_loss 2.548, FS_loss 24.331, KL_loss: 217846021514922.125, 
	
18510/191900 (epoch 9) loss: 2.548, gen_loss: 14.732, Ret_loss 2.548, FS_loss 24.332, KL_loss: 216967616409263.938, 
	
18515/191900 (epoch 9) loss: 2.548, gen_loss: 14.728, Ret_loss 2.548, FS_loss 24.331, KL_loss: 216096262621518.938, 
	
18520/191900 (epoch 9) loss: 2.548, gen_loss: 14.723, Ret_loss 2.548, FS_loss 24.330, KL_loss: 215232248586165.375, 
	
18525/191900 (epoch 9) loss: 2.548, gen_loss: 14.718, Ret_loss 2.548, FS_loss 24.329, KL_loss: 214374787059817.594, 
	
18530/191900 (epoch 9) loss: 2.547, gen_loss: 14.714, Ret_loss 2.547, FS_loss 24.330, KL_loss: 213524103450612.656, 
	
18535/191900 (epoch 9) loss: 2.547, gen_loss: 14.709, Ret_loss 2.547, FS_loss 24.328, KL_loss: 212851124908754.094, 
	
18540/191900 (epoch 9) loss: 2.547, gen_loss: 14.707, Ret_loss 2.547, FS_loss 24.332, KL_loss: 212013258715527.875, 
	
18545/191900 (epoch 9) loss: 2.547, gen_loss: 14.703, Ret_loss 2.547, FS_loss 24.333, KL_loss: 211181890928874.531, 
	
18550/191900 (epoch 9) loss: 2.546, gen_loss: 14.700, Ret_loss 2.546, FS_loss 24.335, KL_loss: 210363810512246.438, 
	
18555/191900 (epoch 9) loss: 2.546, gen_loss: 14.695, Ret_loss 2.546, FS_loss 24.333, KL_loss: 209545633728539.125, 
	
18560/191900 (epoch 9) loss: 2.546, gen_loss: 14.691, Ret_loss 2.546, FS_loss 24.332, KL_loss: 208740093336485.531, 
	
18565/191900 (epoch 9) loss: 2.546, gen_loss: 14.686, Ret_loss 2.546, FS_loss 24.331, KL_loss: 208862572105099.406, 
	
18570/191900 (epoch 9) loss: 2.547, gen_loss: 14.682, Ret_loss 2.547, FS_loss 24.330, KL_loss: 208059349682399.719, 
	
18575/191900 (epoch 9) loss: 2.547, gen_loss: 14.678, Ret_loss 2.547, FS_loss 24.330, KL_loss: 207320310534734.094, 
	
18580/191900 (epoch 9) loss: 2.547, gen_loss: 14.674, Ret_loss 2.547, FS_loss 24.330, KL_loss: 206529307753214.062, 
	
18585/191900 (epoch 9) loss: 2.547, gen_loss: 14.671, Ret_loss 2.547, FS_loss 24.330, KL_loss: 205747106570701.031, 
	
18590/191900 (epoch 9) loss: 2.547, gen_loss: 14.668, Ret_loss 2.547, FS_loss 24.331, KL_loss: 205075950317288.750, 
	
18595/191900 (epoch 9) loss: 2.547, gen_loss: 14.664, Ret_loss 2.547, FS_loss 24.332, KL_loss: 204302388170297.594, 
	
18600/191900 (epoch 9) loss: 2.546, gen_loss: 14.661, Ret_loss 2.546, FS_loss 24.332, KL_loss: 203537334679154.750, 
	
18605/191900 (epoch 9) loss: 2.546, gen_loss: 14.655, Ret_loss 2.546, FS_loss 24.328, KL_loss: 202808831089190.750, 
	
18610/191900 (epoch 9) loss: 2.546, gen_loss: 14.652, Ret_loss 2.546, FS_loss 24.327, KL_loss: 202053348202263.719, 
	
18615/191900 (epoch 9) loss: 2.546, gen_loss: 14.650, Ret_loss 2.546, FS_loss 24.328, KL_loss: 201326856553136.281, 
	
18620/191900 (epoch 9) loss: 2.546, gen_loss: 14.648, Ret_loss 2.546, FS_loss 24.329, KL_loss: 200592805293072.719, 
	
18625/191900 (epoch 9) loss: 2.546, gen_loss: 14.645, Ret_loss 2.546, FS_loss 24.329, KL_loss: 199857844788304.875, 
	
18630/191900 (epoch 9) loss: 2.546, gen_loss: 14.643, Ret_loss 2.546, FS_loss 24.329, KL_loss: 200485422364304.594, 
	
18635/191900 (epoch 9) loss: 2.545, gen_loss: 14.641, Ret_loss 2.545, FS_loss 24.331, KL_loss: 199807724273526.000, 
	
18640/191900 (epoch 9) loss: 2.545, gen_loss: 14.637, Ret_loss 2.545, FS_loss 24.330, KL_loss: 199079669746587.875, 
	
18645/191900 (epoch 9) loss: 2.544, gen_loss: 14.634, Ret_loss 2.544, FS_loss 24.329, KL_loss: 198364303530161.281, 
	
18650/191900 (epoch 9) loss: 2.544, gen_loss: 14.631, Ret_loss 2.544, FS_loss 24.329, KL_loss: 238150638556369.438, 
	
18655/191900 (epoch 9) loss: 2.544, gen_loss: 14.629, Ret_loss 2.544, FS_loss 24.329, KL_loss: 237290893941440.500, 
	
18660/191900 (epoch 9) loss: 2.544, gen_loss: 14.627, Ret_loss 2.544, FS_loss 24.329, KL_loss: 236437404345390.219, 
	
18665/191900 (epoch 9) loss: 2.544, gen_loss: 14.624, Ret_loss 2.544, FS_loss 24.328, KL_loss: 235590660050994.844, 
	
18670/191900 (epoch 9) loss: 2.544, gen_loss: 14.621, Ret_loss 2.544, FS_loss 24.325, KL_loss: 234749290333461.031, 
	
18675/191900 (epoch 9) loss: 2.544, gen_loss: 14.618, Ret_loss 2.544, FS_loss 24.324, KL_loss: 233916377745126.500, 
	
18680/191900 (epoch 9) loss: 2.544, gen_loss: 14.615, Ret_loss 2.544, FS_loss 24.323, KL_loss: 233087161542032.719, 
	
18685/191900 (epoch 9) loss: 2.545, gen_loss: 14.613, Ret_loss 2.545, FS_loss 24.324, KL_loss: 232263697267109.000, 
	
18690/191900 (epoch 9) loss: 2.544, gen_loss: 14.610, Ret_loss 2.544, FS_loss 24.323, KL_loss: 231453620056934.938, 
	
18695/191900 (epoch 9) loss: 2.544, gen_loss: 14.608, Ret_loss 2.544, FS_loss 24.323, KL_loss: 230642069290846.844, 
	
18700/191900 (epoch 9) loss: 2.544, gen_loss: 14.605, Ret_loss 2.544, FS_loss 24.322, KL_loss: 229836368130311.344, 
	
18705/191900 (epoch 9) loss: 2.544, gen_loss: 14.602, Ret_loss 2.544, FS_loss 24.321, KL_loss: 229660741250766.406, 
	
18710/191900 (epoch 9) loss: 2.544, gen_loss: 14.600, Ret_loss 2.544, FS_loss 24.320, KL_loss: 228866467072540.281, 
	
18715/191900 (epoch 9) loss: 2.544, gen_loss: 14.597, Ret_loss 2.544, FS_loss 24.318, KL_loss: 228079359295028.625, 
	
18720/191900 (epoch 9) loss: 2.544, gen_loss: 14.594, Ret_loss 2.544, FS_loss 24.317, KL_loss: 228471565115393.250, 
	
18725/191900 (epoch 9) loss: 2.544, gen_loss: 14.591, Ret_loss 2.544, FS_loss 24.316, KL_loss: 227686514160508.219, 
	
18730/191900 (epoch 9) loss: 2.545, gen_loss: 14.589, Ret_loss 2.545, FS_loss 24.315, KL_loss: 226908510510788.219, 
	
18735/191900 (epoch 9) loss: 2.545, gen_loss: 14.588, Ret_loss 2.545, FS_loss 24.317, KL_loss: 226136189016779.562, 
	
18740/191900 (epoch 9) loss: 2.545, gen_loss: 14.586, Ret_loss 2.545, FS_loss 24.315, KL_loss: 225367299082191.062, 
	
18745/191900 (epoch 9) loss: 2.545, gen_loss: 14.584, Ret_loss 2.545, FS_loss 24.315, KL_loss: 224647440146274.938, 
	
18750/191900 (epoch 9) loss: 2.545, gen_loss: 14.581, Ret_loss 2.545, FS_loss 24.314, KL_loss: 223889949144981.281, 
	
18755/191900 (epoch 9) loss: 2.545, gen_loss: 14.579, Ret_loss 2.545, FS_loss 24.313, KL_loss: 223139431983569.969, 
	
18760/191900 (epoch 9) loss: 2.545, gen_loss: 14.577, Ret_loss 2.545, FS_loss 24.313, KL_loss: 222591217601832.719, 
	
18765/191900 (epoch 9) loss: 2.545, gen_loss: 14.574, Ret_loss 2.545, FS_loss 24.312, KL_loss: 221848128054671.156, 
	
18770/191900 (epoch 9) loss: 2.544, gen_loss: 14.573, Ret_loss 2.544, FS_loss 24.314, KL_loss: 221120602939876.531, 
	
18775/191900 (epoch 9) loss: 2.544, gen_loss: 14.572, Ret_loss 2.544, FS_loss 24.315, KL_loss: 222782082115452.188, 
	
18780/191900 (epoch 9) loss: 2.544, gen_loss: 14.571, Ret_loss 2.544, FS_loss 24.316, KL_loss: 222044406248876.938, 
	
18785/191900 (epoch 9) loss: 2.544, gen_loss: 14.568, Ret_loss 2.544, FS_loss 24.315, KL_loss: 221311636526052.969, 
	
18790/191900 (epoch 9) loss: 2.544, gen_loss: 14.566, Ret_loss 2.544, FS_loss 24.315, KL_loss: 220585665587536.156, 
	
18795/191900 (epoch 9) loss: 2.545, gen_loss: 14.565, Ret_loss 2.545, FS_loss 24.315, KL_loss: 219862530903158.188, 
	
18800/191900 (epoch 9) loss: 2.545, gen_loss: 14.562, Ret_loss 2.545, FS_loss 24.315, KL_loss: 219147303785919.750, 
	
18805/191900 (epoch 9) loss: 2.545, gen_loss: 14.560, Ret_loss 2.545, FS_loss 24.314, KL_loss: 218440574149082.312, 
	
18810/191900 (epoch 9) loss: 2.545, gen_loss: 14.558, Ret_loss 2.545, FS_loss 24.313, KL_loss: 217732076071565.625, 
	
18815/191900 (epoch 9) loss: 2.545, gen_loss: 14.555, Ret_loss 2.545, FS_loss 24.311, KL_loss: 217036433204890.750, 
	
18820/191900 (epoch 9) loss: 2.545, gen_loss: 14.553, Ret_loss 2.545, FS_loss 24.310, KL_loss: 216576412748285.344, 
	
18825/191900 (epoch 9) loss: 2.546, gen_loss: 14.551, Ret_loss 2.546, FS_loss 24.309, KL_loss: 215880531522870.812, 
	
18830/191900 (epoch 9) loss: 2.545, gen_loss: 14.548, Ret_loss 2.545, FS_loss 24.307, KL_loss: 215190955192707.938, 
	
18835/191900 (epoch 9) loss: 2.545, gen_loss: 14.547, Ret_loss 2.545, FS_loss 24.307, KL_loss: 222010719159420.969, 
	
18840/191900 (epoch 9) loss: 2.545, gen_loss: 14.544, Ret_loss 2.545, FS_loss 24.306, KL_loss: 221303708963307.125, 
	
18845/191900 (epoch 9) loss: 2.545, gen_loss: 14.541, Ret_loss 2.545, FS_loss 24.304, KL_loss: 220602543297493.094, 
	
18850/191900 (epoch 9) loss: 2.546, gen_loss: 14.539, Ret_loss 2.546, FS_loss 24.303, KL_loss: 219904595399250.312, 
	
18855/191900 (epoch 9) loss: 2.545, gen_loss: 14.537, Ret_loss 2.545, FS_loss 24.304, KL_loss: 219211332883762.219, 
	
18860/191900 (epoch 9) loss: 2.545, gen_loss: 14.535, Ret_loss 2.545, FS_loss 24.304, KL_loss: 218527801642868.250, 
	
18865/191900 (epoch 9) loss: 2.545, gen_loss: 14.534, Ret_loss 2.545, FS_loss 24.304, KL_loss: 217843128707550.281, 
	
18870/191900 (epoch 9) loss: 2.545, gen_loss: 14.532, Ret_loss 2.545, FS_loss 24.303, KL_loss: 217180836477014.406, 
	
18875/191900 (epoch 9) loss: 2.545, gen_loss: 14.530, Ret_loss 2.545, FS_loss 24.302, KL_loss: 216524221459057.875, 
	
18880/191900 (epoch 9) loss: 2.545, gen_loss: 14.528, Ret_loss 2.545, FS_loss 24.303, KL_loss: 216352627774619.812, 
	
18885/191900 (epoch 9) loss: 2.545, gen_loss: 14.525, Ret_loss 2.545, FS_loss 24.301, KL_loss: 216343954629997.219, 
	
18890/191900 (epoch 9) loss: 2.545, gen_loss: 14.523, Ret_loss 2.545, FS_loss 24.301, KL_loss: 215676637252908.250, 
	
18895/191900 (epoch 9) loss: 2.545, gen_loss: 14.522, Ret_loss 2.545, FS_loss 24.302, KL_loss: 215073916637871.500, 
	
18900/191900 (epoch 9) loss: 2.545, gen_loss: 14.520, Ret_loss 2.545, FS_loss 24.302, KL_loss: 214416068820725.000, 
	
18905/191900 (epoch 9) loss: 2.545, gen_loss: 14.517, Ret_loss 2.545, FS_loss 24.300, KL_loss: 213761531116159.438, 
	
18910/191900 (epoch 9) loss: 2.544, gen_loss: 14.515, Ret_loss 2.544, FS_loss 24.302, KL_loss: 213401657911480.188, 
	
18915/191900 (epoch 9) loss: 2.544, gen_loss: 14.513, Ret_loss 2.544, FS_loss 24.302, KL_loss: 212753259939571.719, 
	
18920/191900 (epoch 9) loss: 2.544, gen_loss: 14.510, Ret_loss 2.544, FS_loss 24.300, KL_loss: 212109028814134.938, 
	
18925/191900 (epoch 9) loss: 2.544, gen_loss: 14.507, Ret_loss 2.544, FS_loss 24.299, KL_loss: 211475879660557.625, 
	
18930/191900 (epoch 9) loss: 2.544, gen_loss: 14.504, Ret_loss 2.544, FS_loss 24.299, KL_loss: 210839143379098.844, 
	
18935/191900 (epoch 9) loss: 2.544, gen_loss: 14.501, Ret_loss 2.544, FS_loss 24.297, KL_loss: 210207664041614.375, 
	
18940/191900 (epoch 9) loss: 2.544, gen_loss: 14.499, Ret_loss 2.544, FS_loss 24.296, KL_loss: 209642815414519.094, 
	
18945/191900 (epoch 9) loss: 2.544, gen_loss: 14.497, Ret_loss 2.544, FS_loss 24.298, KL_loss: 209022328473784.000, 
	
18950/191900 (epoch 9) loss: 2.544, gen_loss: 14.494, Ret_loss 2.544, FS_loss 24.297, KL_loss: 208427958924533.625, 
	
18955/191900 (epoch 9) loss: 2.544, gen_loss: 14.492, Ret_loss 2.544, FS_loss 24.296, KL_loss: 207812558092198.656, 
	
18960/191900 (epoch 9) loss: 2.544, gen_loss: 14.491, Ret_loss 2.544, FS_loss 24.299, KL_loss: 207221816186205.625, 
	
18965/191900 (epoch 9) loss: 2.543, gen_loss: 14.489, Ret_loss 2.543, FS_loss 24.302, KL_loss: 207959711190894.406, 
	
18970/191900 (epoch 9) loss: 2.543, gen_loss: 14.487, Ret_loss 2.543, FS_loss 24.301, KL_loss: 207348154645467.250, 
	
18975/191900 (epoch 9) loss: 2.543, gen_loss: 14.485, Ret_loss 2.543, FS_loss 24.302, KL_loss: 206748390138811.531, 
	
18980/191900 (epoch 9) loss: 2.543, gen_loss: 14.482, Ret_loss 2.543, FS_loss 24.300, KL_loss: 206144291522157.000, 
	
18985/191900 (epoch 9) loss: 2.543, gen_loss: 14.480, Ret_loss 2.543, FS_loss 24.301, KL_loss: 205543662611211.188, 
	
18990/191900 (epoch 9) loss: 2.543, gen_loss: 14.478, Ret_loss 2.543, FS_loss 24.301, KL_loss: 204972242395197.312, 
	
18995/191900 (epoch 9) loss: 2.543, gen_loss: 14.476, Ret_loss 2.543, FS_loss 24.302, KL_loss: 204378900142161.312, 
	
19000/191900 (epoch 9) loss: 2.542, gen_loss: 14.474, Ret_loss 2.542, FS_loss 24.301, KL_loss: 203793064881057.875, 
	
19005/191900 (epoch 9) loss: 2.542, gen_loss: 14.471, Ret_loss 2.542, FS_loss 24.301, KL_loss: 203270214187653.094, 
	
19010/191900 (epoch 9) loss: 2.542, gen_loss: 14.470, Ret_loss 2.542, FS_loss 24.303, KL_loss: 202686728946515.562, 
	
19015/191900 (epoch 9) loss: 2.542, gen_loss: 14.468, Ret_loss 2.542, FS_loss 24.303, KL_loss: 202106709137173.844, 
	
19020/191900 (epoch 9) loss: 2.542, gen_loss: 14.466, Ret_loss 2.542, FS_loss 24.305, KL_loss: 201537010097983.500, 
	
19025/191900 (epoch 9) loss: 2.542, gen_loss: 14.463, Ret_loss 2.542, FS_loss 24.304, KL_loss: 202975485927978.875, 
	
19030/191900 (epoch 9) loss: 2.542, gen_loss: 14.461, Ret_loss 2.542, FS_loss 24.304, KL_loss: 202398937963827.781, 
	
19035/191900 (epoch 9) loss: 2.542, gen_loss: 14.458, Ret_loss 2.542, FS_loss 24.304, KL_loss: 201826119187554.625, 
	
19040/191900 (epoch 9) loss: 2.542, gen_loss: 14.456, Ret_loss 2.542, FS_loss 24.304, KL_loss: 201268430816933.469, 
	
19045/191900 (epoch 9) loss: 2.542, gen_loss: 14.455, Ret_loss 2.542, FS_loss 24.306, KL_loss: 200701709358251.906, 
	
19050/191900 (epoch 9) loss: 2.541, gen_loss: 14.453, Ret_loss 2.541, FS_loss 24.307, KL_loss: 200139040057678.250, 
	
19055/191900 (epoch 9) loss: 2.541, gen_loss: 14.451, Ret_loss 2.541, FS_loss 24.308, KL_loss: 199943022619460.969, 
	
19060/191900 (epoch 9) loss: 2.541, gen_loss: 14.449, Ret_loss 2.541, FS_loss 24.309, KL_loss: 199396210834950.875, 
	
19065/191900 (epoch 9) loss: 2.541, gen_loss: 14.447, Ret_loss 2.541, FS_loss 24.309, KL_loss: 198847705820458.938, 
	
19070/191900 (epoch 9) loss: 2.541, gen_loss: 14.445, Ret_loss 2.541, FS_loss 24.308, KL_loss: 198323707215005.594, 
	
19075/191900 (epoch 9) loss: 2.541, gen_loss: 14.442, Ret_loss 2.541, FS_loss 24.307, KL_loss: 197776350886563.656, 
	
19080/191900 (epoch 9) loss: 2.541, gen_loss: 14.440, Ret_loss 2.541, FS_loss 24.307, KL_loss: 197231166679361.906, 
	
19085/191900 (epoch 9) loss: 2.541, gen_loss: 14.437, Ret_loss 2.541, FS_loss 24.306, KL_loss: 196859027215022.625, 
	
19090/191900 (epoch 9) loss: 2.541, gen_loss: 14.436, Ret_loss 2.541, FS_loss 24.307, KL_loss: 196318938740972.875, 
	
19095/191900 (epoch 9) loss: 2.541, gen_loss: 14.433, Ret_loss 2.541, FS_loss 24.307, KL_loss: 195781878750471.719, 
	
19100/191900 (epoch 9) loss: 2.541, gen_loss: 14.432, Ret_loss 2.541, FS_loss 24.308, KL_loss: 195285434939558.188, 
	
19105/191900 (epoch 9) loss: 2.541, gen_loss: 14.429, Ret_loss 2.541, FS_loss 24.308, KL_loss: 194759059595543.562, 
	
19110/191900 (epoch 9) loss: 2.541, gen_loss: 14.427, Ret_loss 2.541, FS_loss 24.308, KL_loss: 194409143464967.250, 
	
19115/191900 (epoch 9) loss: 2.541, gen_loss: 14.425, Ret_loss 2.541, FS_loss 24.310, KL_loss: 193882917965891.156, 
	
19120/191900 (epoch 9) loss: 2.541, gen_loss: 14.423, Ret_loss 2.541, FS_loss 24.311, KL_loss: 193377978651397.250, 
	
19125/191900 (epoch 9) loss: 2.541, gen_loss: 14.420, Ret_loss 2.541, FS_loss 24.311, KL_loss: 192864269228713.750, 
	
19130/191900 (epoch 9) loss: 2.541, gen_loss: 14.418, Ret_loss 2.541, FS_loss 24.312, KL_loss: 192346845619160.906, 
	
19135/191900 (epoch 9) loss: 2.541, gen_loss: 14.415, Ret_loss 2.541, FS_loss 24.312, KL_loss: 191838777911438.219, 
	
19140/191900 (epoch 9) loss: 2.541, gen_loss: 14.413, Ret_loss 2.541, FS_loss 24.313, KL_loss: 191372784041053.625, 
	
19145/191900 (epoch 9) loss: 2.541, gen_loss: 14.410, Ret_loss 2.541, FS_loss 24.313, KL_loss: 191599138361344.531, 
	
19150/191900 (epoch 9) loss: 2.541, gen_loss: 14.408, Ret_loss 2.541, FS_loss 24.313, KL_loss: 191089662381404.062, 
	
19155/191900 (epoch 9) loss: 2.541, gen_loss: 14.405, Ret_loss 2.541, FS_loss 24.312, KL_loss: 190583473925619.781, 
	
19160/191900 (epoch 9) loss: 2.541, gen_loss: 14.403, Ret_loss 2.541, FS_loss 24.314, KL_loss: 190113156317248.469, 
	
19165/191900 (epoch 9) loss: 2.541, gen_loss: 14.400, Ret_loss 2.541, FS_loss 24.315, KL_loss: 189612016069641.719, 
	
19170/191900 (epoch 9) loss: 2.541, gen_loss: 14.398, Ret_loss 2.541, FS_loss 24.317, KL_loss: 189128819361942.375, 
	
19175/191900 (epoch 9) loss: 2.541, gen_loss: 14.395, Ret_loss 2.541, FS_loss 24.316, KL_loss: 188633277955940.656, 
	
19180/191900 (epoch 9) loss: 2.541, gen_loss: 14.393, Ret_loss 2.541, FS_loss 24.318, KL_loss: 188139815875751.812, 
	
19185/191900 (epoch 9) loss: 2.541, gen_loss: 14.390, Ret_loss 2.541, FS_loss 24.317, KL_loss: 187784611413181.281, 
	
19190/191900 (epoch 10) loss: 2.541, gen_loss: 14.279, Ret_loss 2.541, FS_loss 26.905, KL_loss: 408578686976.000, 
	
19195/191900 (epoch 10) loss: 2.444, gen_loss: 13.646, Ret_loss 2.444, FS_loss 25.060, KL_loss: 931249558869.333, 
	
19200/191900 (epoch 10) loss: 2.460, gen_loss: 13.518, Ret_loss 2.460, FS_loss 24.887, KL_loss: 34948073982882.910, 
	
19205/191900 (epoch 10) loss: 2.437, gen_loss: 13.461, Ret_loss 2.437, FS_loss 24.806, KL_loss: 24083146923520.000, 
	
19210/191900 (epoch 10) loss: 2.409, gen_loss: 13.426, Ret_loss 2.409, FS_loss 24.761, KL_loss: 20093230020705.523, 
	
19215/191900 (epoch 10) loss: 2.402, gen_loss: 13.406, Ret_loss 2.402, FS_loss 24.761, KL_loss: 16312973254971.076, 
	
19220/191900 (epoch 10) loss: 2.431, gen_loss: 13.419, Ret_loss 2.431, FS_loss 24.774, KL_loss: 13912005864018.580, 
	
19225/191900 (epoch 10) loss: 2.435, gen_loss: 13.440, Ret_loss 2.435, FS_loss 24.811, KL_loss: 28568947053681.777, 
	
19230/191900 (epoch 10) loss: 2.442, gen_loss: 13.458, Ret_loss 2.442, FS_loss 24.765, KL_loss: 25126136361259.707, 
	
19235/191900 (epoch 10) loss: 2.447, gen_loss: 13.495, Ret_loss 2.447, FS_loss 24.774, KL_loss: 23241877391270.957, 
	
19240/191900 (epoch 10) loss: 2.452, gen_loss: 13.501, Ret_loss 2.452, FS_loss 24.775, KL_loss: 21138548614726.273, 
	
19245/191900 (epoch 10) loss: 2.454, gen_loss: 13.496, Ret_loss 2.454, FS_loss 24.755, KL_loss: 20797180934290.285, 
	
19250/191900 (epoch 10) loss: 2.468, gen_loss: 13.478, Ret_loss 2.468, FS_loss 24.697, KL_loss: 20224492840254.949, 
	
19255/191900 (epoch 10) loss: 2.469, gen_loss: 13.479, Ret_loss 2.469, FS_loss 24.692, KL_loss: 18719651925767.758, 
	
19260/191900 (epoch 10) loss: 2.468, gen_loss: 13.470, Ret_loss 2.468, FS_loss 24.690, KL_loss: 17839012293790.648, 
	
19265/191900 (epoch 10) loss: 2.470, gen_loss: 13.473, Ret_loss 2.470, FS_loss 24.692, KL_loss: 20202638167956.211, 
	
19270/191900 (epoch 10) loss: 2.472, gen_loss: 13.478, Ret_loss 2.472, FS_loss 24.697, KL_loss: 18962395919600.199, 
	
19275/191900 (epoch 10) loss: 2.479, gen_loss: 13.478, Ret_loss 2.479, FS_loss 24.713, KL_loss: 17964258803902.512, 
	
19280/191900 (epoch 10) loss: 2.475, gen_loss: 13.477, Ret_loss 2.475, FS_loss 24.721, KL_loss: 16987852763811.164, 
	
19285/191900 (epoch 10) loss: 2.480, gen_loss: 13.466, Ret_loss 2.480, FS_loss 24.707, KL_loss: 16533840889344.000, 
	
19290/191900 (epoch 10) loss: 2.489, gen_loss: 13.476, Ret_loss 2.489, FS_loss 24.704, KL_loss: 15974421736052.594, 
	
19295/191900 (epoch 10) loss: 2.486, gen_loss: 13.487, Ret_loss 2.486, FS_loss 24.724, KL_loss: 15346457297359.697, 
	
19300/191900 (epoch 10) loss: 2.488, gen_loss: 13.478, Ret_loss 2.488, FS_loss 24.711, KL_loss: 14990081970212.900, 
	
19305/191900 (epoch 10) loss: 2.492, gen_loss: 13.478, Ret_loss 2.492, FS_loss 24.708, KL_loss: 14506782776637.793, 
	
19310/191900 (epoch 10) loss: 2.497, gen_loss: 13.473, Ret_loss 2.497, FS_loss 24.692, KL_loss: 13950788764866.645, 
	
19315/191900 (epoch 10) loss: 2.497, gen_loss: 13.475, Ret_loss 2.497, FS_loss 24.698, KL_loss: 16812486613479.619, 
	
19320/191900 (epoch 10) loss: 2.501, gen_loss: 13.460, Ret_loss 2.501, FS_loss 24.669, KL_loss: 16175620525235.787, 
	
19325/191900 (epoch 10) loss: 2.499, gen_loss: 13.454, Ret_loss 2.499, FS_loss 24.659, KL_loss: 16171522911653.646, 
	
19330/191900 (epoch 10) loss: 2.497, gen_loss: 13.454, Ret_loss 2.497, FS_loss 24.658, KL_loss: 18130224377652.652, 
	
19335/191900 (epoch 10) loss: 2.496, gen_loss: 13.458, Ret_loss 2.496, FS_loss 24.667, KL_loss: 17581838735163.617, 
	
19340/191900 (epoch 10) loss: 2.495, gen_loss: 13.459, Ret_loss 2.495, FS_loss 24.666, KL_loss: 18155684094440.266, 
	
19345/191900 (epoch 10) loss: 2.498, gen_loss: 13.464, Ret_loss 2.498, FS_loss 24.672, KL_loss: 18273539398944.820, 
	
19350/191900 (epoch 10) loss: 2.499, gen_loss: 13.465, Ret_loss 2.499, FS_loss 24.661, KL_loss: 17712791874998.855, 
	
19355/191900 (epoch 10) loss: 2.497, gen_loss: 13.463, Ret_loss 2.497, FS_loss 24.648, KL_loss: 19033251303670.746, 
	
19360/191900 (epoch 10) loss: 2.496, gen_loss: 13.472, Ret_loss 2.496, FS_loss 24.660, KL_loss: 18513620200202.480, 
	
19365/191900 (epoch 10) loss: 2.498, gen_loss: 13.468, Ret_loss 2.498, FS_loss 24.644, KL_loss: 18014392923601.453, 
	
19370/191900 (epoch 10) loss: 2.499, gen_loss: 13.470, Ret_loss 2.499, FS_loss 24.638, KL_loss: 19082903021556.684, 
	
19375/191900 (epoch 10) loss: 2.496, gen_loss: 13.472, Ret_loss 2.496, FS_loss 24.633, KL_loss: 18573867584346.840, 
	
19380/191900 (epoch 10) loss: 2.497, gen_loss: 13.480, Ret_loss 2.497, FS_loss 24.637, KL_loss: 18148835207993.633, 
	
19385/191900 (epoch 10) loss: 2.496, gen_loss: 13.489, Ret_loss 2.496, FS_loss 24.637, KL_loss: 17724032060604.082, 
	
19390/191900 (epoch 10) loss: 2.494, gen_loss: 13.497, Ret_loss 2.494, FS_loss 24.629, KL_loss: 17297700862614.289, 
	
19395/191900 (epoch 10) loss: 2.493, gen_loss: 13.500, Ret_loss 2.493, FS_loss 24.613, KL_loss: 18474253629261.047, 
	
19400/191900 (epoch 10) loss: 2.495, gen_loss: 13.510, Ret_loss 2.495, FS_loss 24.610, KL_loss: 18069779628420.246, 
	
19405/191900 (epoch 10) loss: 2.493, gen_loss: 13.519, Ret_loss 2.493, FS_loss 24.607, KL_loss: 17667195372278.520, 
	
19410/191900 (epoch 10) loss: 2.496, gen_loss: 13.528, Ret_loss 2.496, FS_loss 24.603, KL_loss: 18003097396793.918, 
	
19415/191900 (epoch 10) loss: 2.498, gen_loss: 13.531, Ret_loss 2.498, FS_loss 24.589, KL_loss: 18402362863289.770, 
	
19420/191900 (epoch 10) loss: 2.497, gen_loss: 13.539, Ret_loss 2.497, FS_loss 24.578, KL_loss: 18011182896469.332, 
	
19425/191900 (epoch 10) loss: 2.500, gen_loss: 13.550, Ret_loss 2.500, FS_loss 24.578, KL_loss: 18376623461185.086, 
	
19430/191900 (epoch 10) loss: 2.502, gen_loss: 13.558, Ret_loss 2.502, FS_loss 24.567, KL_loss: 18011843378112.266, 
	
19435/191900 (epoch 10) loss: 2.500, gen_loss: 13.568, Ret_loss 2.500, FS_loss 24.564, KL_loss: 17801415984635.836, 
	
19440/191900 (epoch 10) loss: 2.502, gen_loss: 13.577, Ret_loss 2.502, FS_loss 24.558, KL_loss: 4452641463840033.500, 
	
19445/191900 (epoch 10) loss: 2.503, gen_loss: 13.590, Ret_loss 2.503, FS_loss 24.562, KL_loss: 4365689781463488.000, 
	
19450/191900 (epoch 10) loss: 2.503, gen_loss: 13.600, Ret_loss 2.503, FS_loss 24.565, KL_loss: 4282074783062463.500, 
	
19455/191900 (epoch 10) loss: 2.506, gen_loss: 13.605, Ret_loss 2.506, FS_loss 24.560, KL_loss: 4202554719350507.000, 
	
19460/191900 (epoch 10) loss: 2.504, gen_loss: 13.611, Ret_loss 2.504, FS_loss 24.548, KL_loss: 4125024761593130.500, 
	
19465/191900 (epoch 10) loss: 2.505, gen_loss: 13.617, Ret_loss 2.505, FS_loss 24.541, KL_loss: 4050446727733188.500, 
	
19470/191900 (epoch 10) loss: 2.505, gen_loss: 13.626, Ret_loss 2.505, FS_loss 24.541, KL_loss: 3978392537588149.500, 
	
19475/191900 (epoch 10) loss: 2.505, gen_loss: 13.630, Ret_loss 2.505, FS_loss 24.530, KL_loss: 3908905963215865.000, 
	
19480/191900 (epoch 10) loss: 2.505, gen_loss: 13.641, Ret_loss 2.505, FS_loss 24.532, KL_loss: 3841822895606471.000, 
	
19485/191900 (epoch 10) loss: 2.505, gen_loss: 13.651, Ret_loss 2.505, FS_loss 24.531, KL_loss: 3776947127676430.000, 
	
19490/191900 (epoch 10) loss: 2.506, gen_loss: 13.661, Ret_loss 2.506, FS_loss 24.529, KL_loss: 3714789550106127.500, 
	
19495/191900 (epoch 10) loss: 2.503, gen_loss: 13.670, Ret_loss 2.503, FS_loss 24.524, KL_loss: 3654111509253956.500, 
	
19500/191900 (epoch 10) loss: 2.500, gen_loss: 13.679, Ret_loss 2.500, FS_loss 24.524, KL_loss: 3595433426952692.500, 
	
19505/191900 (epoch 10) loss: 2.498, gen_loss: 13.690, Ret_loss 2.498, FS_loss 24.528, KL_loss: 3582915212235892.500, 
	
19510/191900 (epoch 10) loss: 2.496, gen_loss: 13.700, Ret_loss 2.496, FS_loss 24.530, KL_loss: 3527113331842995.500, 
	
19515/191900 (epoch 10) loss: 2.496, gen_loss: 13.709, Ret_loss 2.496, FS_loss 24.526, KL_loss: 3473044813301069.000, 
	
19520/191900 (epoch 10) loss: 2.496, gen_loss: 13.722, Ret_loss 2.496, FS_loss 24.530, KL_loss: 4130203927706806.500, 
	
19525/191900 (epoch 10) loss: 2.494, gen_loss: 13.733, Ret_loss 2.494, FS_loss 24.529, KL_loss: 4068745904221135.000, 
	
19530/191900 (epoch 10) loss: 2.494, gen_loss: 13.740, Ret_loss 2.494, FS_loss 24.525, KL_loss: 4250379838719347.500, 
	
19535/191900 (epoch 10) loss: 2.495, gen_loss: 13.752, Ret_loss 2.495, FS_loss 24.524, KL_loss: 4188958189574890.500, 
	
19540/191900 (epoch 10) loss: 2.495, gen_loss: 13.765, Ret_loss 2.495, FS_loss 24.527, KL_loss: 4129287090232613.000, 
	
19545/191900 (epoch 10) loss: 2.496, gen_loss: 13.772, Ret_loss 2.496, FS_loss 24.521, KL_loss: 4071292356041876.000, 
	
19550/191900 (epoch 10) loss: 2.497, gen_loss: 13.780, Ret_loss 2.497, FS_loss 24.518, KL_loss: 4014903904211856.000, 
	
19555/191900 (epoch 10) loss: 2.499, gen_loss: 13.790, Ret_loss 2.499, FS_loss 24.518, KL_loss: 3960204185845350.000, 
	
19560/191900 (epoch 10) loss: 2.497, gen_loss: 13.798, Ret_loss 2.497, FS_loss 24.515, KL_loss: 3906833024670561.500, 
	
19565/191900 (epoch 10) loss: 2.497, gen_loss: 13.807, Ret_loss 2.497, FS_loss 24.515, KL_loss: 3854931093989494.500, 
	
19570/191900 (epoch 10) loss: 2.499, gen_loss: 13.813, Ret_loss 2.499, FS_loss 24.513, KL_loss: 3804343806532265.500, 
	
19575/191900 (epoch 10) loss: 2.500, gen_loss: 13.824, Ret_loss 2.500, FS_loss 24.521, KL_loss: 3755086844421103.000, 
	
19580/191900 (epoch 10) loss: 2.499, gen_loss: 13.831, Ret_loss 2.499, FS_loss 24.524, KL_loss: 3707704462491971.500, 
	
19585/191900 (epoch 10) loss: 2.499, gen_loss: 13.836, Ret_loss 2.499, FS_loss 24.519, KL_loss: 3660917749260483.000, 
	
19590/191900 (epoch 10) loss: 2.501, gen_loss: 13.840, Ret_loss 2.501, FS_loss 24.514, KL_loss: 3615327357448272.500, 
	
19595/191900 (epoch 10) loss: 2.502, gen_loss: 13.848, Ret_loss 2.502, FS_loss 24.514, KL_loss: 3571670479060375.500, 
	
19600/191900 (epoch 10) loss: 2.501, gen_loss: 13.853, Ret_loss 2.501, FS_loss 24.509, KL_loss: 3528226806311224.500, 
	
19605/191900 (epoch 10) loss: 2.502, gen_loss: 13.859, Ret_loss 2.502, FS_loss 24.509, KL_loss: 3494665157033855.000, 
	
19610/191900 (epoch 10) loss: 2.500, gen_loss: 13.863, Ret_loss 2.500, FS_loss 24.504, KL_loss: 3453189645995233.000, 
	
19615/191900 (epoch 10) loss: 2.499, gen_loss: 13.872, Ret_loss 2.499, FS_loss 24.510, KL_loss: 3412672556314978.500, 
	
19620/191900 (epoch 10) loss: 2.500, gen_loss: 13.876, Ret_loss 2.500, FS_loss 24.507, KL_loss: 3374842463089646.000, 
	
19625/191900 (epoch 10) loss: 2.500, gen_loss: 13.881, Ret_loss 2.500, FS_loss 24.504, KL_loss: 3336205002811344.000, 
	
19630/191900 (epoch 10) loss: 2.501, gen_loss: 13.885, Ret_loss 2.501, FS_loss 24.501, KL_loss: 3298381280453730.500, 
	
19635/191900 (epoch 10) loss: 2.500, gen_loss: 13.894, Ret_loss 2.500, FS_loss 24.505, KL_loss: 3261673582255015.500, 
	
19640/191900 (epoch 10) loss: 2.500, gen_loss: 13.901, Ret_loss 2.500, FS_loss 24.511, KL_loss: 3225515482561605.500, 
	
19645/191900 (epoch 10) loss: 2.500, gen_loss: 13.905, Ret_loss 2.500, FS_loss 24.507, KL_loss: 3190911341832038.000, 
	
19650/191900 (epoch 10) loss: 2.500, gen_loss: 13.909, Ret_loss 2.500, FS_loss 24.505, KL_loss: 3156304200246650.500, 
	
19655/191900 (epoch 10) loss: 2.501, gen_loss: 13.916, Ret_loss 2.501, FS_loss 24.508, KL_loss: 3122439854285827.500, 
	
19660/191900 (epoch 10) loss: 2.502, gen_loss: 13.917, Ret_loss 2.502, FS_loss 24.502, KL_loss: 3089755162920154.500, 
	
19665/191900 (epoch 10) loss: 2.502, gen_loss: 13.923, Ret_loss 2.502, FS_loss 24.503, KL_loss: 3057300522056307.000, 
	
19670/191900 (epoch 10) loss: 2.501, gen_loss: 13.927, Ret_loss 2.501, FS_loss 24.503, KL_loss: 3025780053653022.000, 
	
19675/191900 (epoch 10) loss: 2.500, gen_loss: 13.934, Ret_loss 2.500, FS_loss 24.505, KL_loss: 2994651995721398.500, 
	
19680/191900 (epoch 10) loss: 2.499, gen_loss: 13.941, Ret_loss 2.499, FS_loss 24.508, KL_loss: 2964186127775947.500, 
	
19685/191900 (epoch 10) loss: 2.501, gen_loss: 13.943, Ret_loss 2.501, FS_loss 24.505, KL_loss: 2934324758724268.500, 
	
19690/191900 (epoch 10) loss: 2.500, gen_loss: 13.947, Ret_loss 2.500, FS_loss 24.505, KL_loss: 2905048131010485.500, 
	
19695/191900 (epoch 10) loss: 2.499, gen_loss: 13.949, Ret_loss 2.499, FS_loss 24.505, KL_loss: 2876411695963989.000, 
	
19700/191900 (epoch 10) loss: 2.500, gen_loss: 13.952, Ret_loss 2.500, FS_loss 24.507, KL_loss: 2848269968858277.500, 
	
19705/191900 (epoch 10) loss: 2.499, gen_loss: 13.953, Ret_loss 2.499, FS_loss 24.505, KL_loss: 2820789350673057.500, 
	
19710/191900 (epoch 10) loss: 2.499, gen_loss: 13.953, Ret_loss 2.499, FS_loss 24.501, KL_loss: 2793773281373641.000, 
	
19715/191900 (epoch 10) loss: 2.499, gen_loss: 13.955, Ret_loss 2.499, FS_loss 24.499, KL_loss: 2767229663047531.000, 
	
19720/191900 (epoch 10) loss: 2.500, gen_loss: 13.959, Ret_loss 2.500, FS_loss 24.502, KL_loss: 2765885215932530.500, 
	
19725/191900 (epoch 10) loss: 2.500, gen_loss: 13.961, Ret_loss 2.500, FS_loss 24.504, KL_loss: 2740095413594134.000, 
	
19730/191900 (epoch 10) loss: 2.499, gen_loss: 13.961, Ret_loss 2.499, FS_loss 24.498, KL_loss: 2714778299727015.500, 
	
19735/191900 (epoch 10) loss: 2.500, gen_loss: 13.963, Ret_loss 2.500, FS_loss 24.497, KL_loss: 2701750822631533.500, 
	
19740/191900 (epoch 10) loss: 2.501, gen_loss: 13.964, Ret_loss 2.501, FS_loss 24.494, KL_loss: 2677234079416625.500, 
	
19745/191900 (epoch 10) loss: 2.502, gen_loss: 13.966, Ret_loss 2.502, FS_loss 24.495, KL_loss: 2653159996672478.000, 
	
19750/191900 (epoch 10) loss: 2.501, gen_loss: 13.970, Ret_loss 2.501, FS_loss 24.497, KL_loss: 2629513511804483.500, 
	
19755/191900 (epoch 10) loss: 2.501, gen_loss: 13.974, Ret_loss 2.501, FS_loss 24.501, KL_loss: 2606289415668140.000, 
	
19760/191900 (epoch 10) loss: 2.500, gen_loss: 13.977, Ret_loss 2.500, FS_loss 24.503, KL_loss: 2583467679865898.000, 
	
19765/191900 (epoch 10) loss: 2.499, gen_loss: 13.980, Ret_loss 2.499, FS_loss 24.503, KL_loss: 2561116364534934.000, 
	
19770/191900 (epoch 10) loss: 2.500, gen_loss: 13.984, Ret_loss 2.500, FS_loss 24.506, KL_loss: 2539077390878513.000, 
	
19775/191900 (epoch 10) loss: 2.501, gen_loss: 13.986, Ret_loss 2.501, FS_loss 24.506, KL_loss: 2517416037786684.500, 
	
19780/191900 (epoch 10) loss: 2.501, gen_loss: 13.988, Ret_loss 2.501, FS_loss 24.507, KL_loss: 2498368519003807.500, 
	
19785/191900 (epoch 10) loss: 2.500, gen_loss: 13.992, Ret_loss 2.500, FS_loss 24.512, KL_loss: 2477414350585850.000, 
	
19790/191900 (epoch 10) loss: 2.501, gen_loss: 13.995, Ret_loss 2.501, FS_loss 24.514, KL_loss: 2456882914757443.500, 
	
19795/191900 (epoch 10) loss: 2.502, gen_loss: 13.994, Ret_loss 2.502, FS_loss 24.508, KL_loss: 2455924897152010.500, 
	
19800/191900 (epoch 10) loss: 2.502, gen_loss: 13.994, Ret_loss 2.502, FS_loss 24.506, KL_loss: 2435827331678890.500, 
	
19805/191900 (epoch 10) loss: 2.501, gen_loss: 13.997, Ret_loss 2.501, FS_loss 24.508, KL_loss: 2416057208319208.500, 
	
19810/191900 (epoch 10) loss: 2.500, gen_loss: 13.999, Ret_loss 2.500, FS_loss 24.509, KL_loss: 2396604289616465.000, 
	
19815/191900 (epoch 10) loss: 2.500, gen_loss: 14.001, Ret_loss 2.500, FS_loss 24.510, KL_loss: 2377465026615994.000, 
	
19820/191900 (epoch 10) loss: 2.500, gen_loss: 14.001, Ret_loss 2.500, FS_loss 24.508, KL_loss: 2358626301407895.500, 
	
19825/191900 (epoch 10) loss: 2.502, gen_loss: 14.003, Ret_loss 2.502, FS_loss 24.508, KL_loss: 2340084260512006.000, 
	
19830/191900 (epoch 10) loss: 2.501, gen_loss: 14.006, Ret_loss 2.501, FS_loss 24.509, KL_loss: 2321896038990537.500, 
	
19835/191900 (epoch 10) loss: 2.502, gen_loss: 14.007, Ret_loss 2.502, FS_loss 24.506, KL_loss: 2303925110132024.000, 
	
19840/191900 (epoch 10) loss: 2.501, gen_loss: 14.011, Ret_loss 2.501, FS_loss 24.511, KL_loss: 2286251082234178.000, 
	
19845/191900 (epoch 10) loss: 2.501, gen_loss: 14.012, Ret_loss 2.501, FS_loss 24.510, KL_loss: 2268826605553887.000, 
	
19850/191900 (epoch 10) loss: 2.501, gen_loss: 14.014, Ret_loss 2.501, FS_loss 24.511, KL_loss: 2251698697150201.750, 
	
19855/191900 (epoch 10) loss: 2.501, gen_loss: 14.017, Ret_loss 2.501, FS_loss 24.514, KL_loss: 2234797998939223.250, 
	
19860/191900 (epoch 10) loss: 2.502, gen_loss: 14.019, Ret_loss 2.502, FS_loss 24.515, KL_loss: 2218147893072071.500, 
	
19865/191900 (epoch 10) loss: 2.503, gen_loss: 14.019, Ret_loss 2.503, FS_loss 24.513, KL_loss: 2201802516761846.500, 
	
19870/191900 (epoch 10) loss: 2.502, gen_loss: 14.021, Ret_loss 2.502, FS_loss 24.512, KL_loss: 2185671952458387.750, 
	
19875/191900 (epoch 10) loss: 2.502, gen_loss: 14.024, Ret_loss 2.502, FS_loss 24.514, KL_loss: 2170592512517957.000, 
	
19880/191900 (epoch 10) loss: 2.501, gen_loss: 14.027, Ret_loss 2.501, FS_loss 24.516, KL_loss: 2154886845566731.000, 
	
19885/191900 (epoch 10) loss: 2.500, gen_loss: 14.029, Ret_loss 2.500, FS_loss 24.519, KL_loss: 2139461189235827.750, 
	
19890/191900 (epoch 10) loss: 2.500, gen_loss: 14.031, Ret_loss 2.500, FS_loss 24.520, KL_loss: 2124202684856251.000, 
	
19895/191900 (epoch 10) loss: 2.500, gen_loss: 14.034, Ret_loss 2.500, FS_loss 24.524, KL_loss: 2109466679541746.500, 
	
19900/191900 (epoch 10) loss: 2.500, gen_loss: 14.038, Ret_loss 2.500, FS_loss 24.529, KL_loss: 2094635716748967.500, 
	
19905/191900 (epoch 10) loss: 2.499, gen_loss: 14.041, Ret_loss 2.499, FS_loss 24.533, KL_loss: 2080208335160518.500, 
	
19910/191900 (epoch 10) loss: 2.499, gen_loss: 14.044, Ret_loss 2.499, FS_loss 24.537, KL_loss: 2065793612295025.500, 
	
19915/191900 (epoch 10) loss: 2.500, gen_loss: 14.045, Ret_loss 2.500, FS_loss 24.536, KL_loss: 2051614967020246.000, 
	
19920/191900 (epoch 10) loss: 2.500, gen_loss: 14.047, Ret_loss 2.500, FS_loss 24.539, KL_loss: 2037618214321558.000, 
	
19925/191900 (epoch 10) loss: 2.501, gen_loss: 14.048, Ret_loss 2.501, FS_loss 24.539, KL_loss: 2023778517279508.500, 
	
19930/191900 (epoch 10) loss: 2.500, gen_loss: 14.048, Ret_loss 2.500, FS_loss 24.537, KL_loss: 2010387066604267.250, 
	
19935/191900 (epoch 10) loss: 2.500, gen_loss: 14.049, Ret_loss 2.500, FS_loss 24.536, KL_loss: 1996916106089083.250, 
	
19940/191900 (epoch 10) loss: 2.501, gen_loss: 14.054, Ret_loss 2.501, FS_loss 24.542, KL_loss: 1983624267727555.250, 
	
19945/191900 (epoch 10) loss: 2.502, gen_loss: 14.055, Ret_loss 2.502, FS_loss 24.540, KL_loss: 1970619566617863.750, 
	
19950/191900 (epoch 10) loss: 2.503, gen_loss: 14.057, Ret_loss 2.503, FS_loss 24.542, KL_loss: 1957675213617702.000, 
	
19955/191900 (epoch 10) loss: 2.503, gen_loss: 14.056, Ret_loss 2.503, FS_loss 24.539, KL_loss: 1945053330566995.250, 
	
19960/191900 (epoch 10) loss: 2.502, gen_loss: 14.057, Ret_loss 2.502, FS_loss 24.539, KL_loss: 1932451768137787.500, 
	
19965/191900 (epoch 10) loss: 2.502, gen_loss: 14.059, Ret_loss 2.502, FS_loss 24.540, KL_loss: 1920005893582561.250, 
	
19970/191900 (epoch 10) loss: 2.501, gen_loss: 14.060, Ret_loss 2.501, FS_loss 24.540, KL_loss: 1907802849614318.000, 
	
19975/191900 (epoch 10) loss: 2.501, gen_loss: 14.061, Ret_loss 2.501, FS_loss 24.539, KL_loss: 1895676138065251.250, 
	
19980/191900 (epoch 10) loss: 2.501, gen_loss: 14.063, Ret_loss 2.501, FS_loss 24.539, KL_loss: 1883960170691234.250, 
	
19985/191900 (epoch 10) loss: 2.501, gen_loss: 14.066, Ret_loss 2.501, FS_loss 24.541, KL_loss: 1872126504086274.250, 
	
19990/191900 (epoch 10) loss: 2.501, gen_loss: 14.068, Ret_loss 2.501, FS_loss 24.544, KL_loss: 1860449898829027.250, 
	
19995/191900 (epoch 10) loss: 2.501, gen_loss: 14.069, Ret_loss 2.501, FS_loss 24.544, KL_loss: 1848909838351671.000, 
	
20000/191900 (epoch 10) loss: 2.501, gen_loss: 14.071, Ret_loss 2.501, FS_loss 24.547, KL_loss: 1837514783011597.250, 
	
20005/191900 (epoch 10) loss: 2.502, gen_loss: 14.071, Ret_loss 2.502, FS_loss 24.545, KL_loss: 1831545174201578.250, 
	
20010/191900 (epoch 10) loss: 2.502, gen_loss: 14.071, Ret_loss 2.502, FS_loss 24.545, KL_loss: 1820390850134108.500, 
	
20015/191900 (epoch 10) loss: 2.502, gen_loss: 14.072, Ret_loss 2.502, FS_loss 24.544, KL_loss: 1809383280117368.500, 
	
20020/191900 (epoch 10) loss: 2.501, gen_loss: 14.074, Ret_loss 2.501, FS_loss 24.547, KL_loss: 1798496633576014.500, 
	
20025/191900 (epoch 10) loss: 2.500, gen_loss: 14.077, Ret_loss 2.500, FS_loss 24.550, KL_loss: 1787743780364960.750, 
	
20030/191900 (epoch 10) loss: 2.499, gen_loss: 14.080, Ret_loss 2.499, FS_loss 24.553, KL_loss: 1777115719197584.250, 
	
20035/191900 (epoch 10) loss: 2.499, gen_loss: 14.082, Ret_loss 2.499, FS_loss 24.557, KL_loss: 1766613711841736.500, 
	
20040/191900 (epoch 10) loss: 2.498, gen_loss: 14.083, Ret_loss 2.498, FS_loss 24.556, KL_loss: 1756300661481699.750, 
	
20045/191900 (epoch 10) loss: 2.499, gen_loss: 14.086, Ret_loss 2.499, FS_loss 24.559, KL_loss: 1746044355531715.250, 
	
20050/191900 (epoch 10) loss: 2.499, gen_loss: 14.089, Ret_loss 2.499, FS_loss 24.560, KL_loss: 1735974139303316.750, 
	
20055/191900 (epoch 10) loss: 2.498, gen_loss: 14.093, Ret_loss 2.498, FS_loss 24.565, KL_loss: 1725958161056771.750, 
	
20060/191900 (epoch 10) loss: 2.498, gen_loss: 14.095, Ret_loss 2.498, FS_loss 24.565, KL_loss: 1733479473744313.250, 
	
20065/191900 (epoch 10) loss: 2.498, gen_loss: 14.097, Ret_loss 2.498, FS_loss 24.566, KL_loss: 1723594885117275.500, 
	
20070/191900 (epoch 10) loss: 2.498, gen_loss: 14.098, Ret_loss 2.498, FS_loss 24.565, KL_loss: 1713817057927648.250, 
	
20075/191900 (epoch 10) loss: 2.498, gen_loss: 14.099, Ret_loss 2.498, FS_loss 24.564, KL_loss: 1704201467460824.500, 
	
20080/191900 (epoch 10) loss: 2.498, gen_loss: 14.099, Ret_loss 2.498, FS_loss 24.563, KL_loss: 1694651712898685.000, 
	
20085/191900 (epoch 10) loss: 2.498, gen_loss: 14.101, Ret_loss 2.498, FS_loss 24.564, KL_loss: 1685270109806817.500, 
	
20090/191900 (epoch 10) loss: 2.499, gen_loss: 14.102, Ret_loss 2.499, FS_loss 24.563, KL_loss: 1676040668437706.500, 
	
20095/191900 (epoch 10) loss: 2.499, gen_loss: 14.104, Ret_loss 2.499, FS_loss 24.565, KL_loss: 1666798629575679.250, 
	
20100/191900 (epoch 10) loss: 2.499, gen_loss: 14.105, Ret_loss 2.499, FS_loss 24.565, KL_loss: 1657701026058664.000, 
	
20105/191900 (epoch 10) loss: 2.498, gen_loss: 14.105, Ret_loss 2.498, FS_loss 24.563, KL_loss: 1648660723725206.000, 
	
20110/191900 (epoch 10) loss: 2.498, gen_loss: 14.108, Ret_loss 2.498, FS_loss 24.565, KL_loss: 1639802281488643.250, 
	
20115/191900 (epoch 10) loss: 2.498, gen_loss: 14.109, Ret_loss 2.498, FS_loss 24.565, KL_loss: 1630948873135165.000, 
	
20120/191900 (epoch 10) loss: 2.498, gen_loss: 14.110, Ret_loss 2.498, FS_loss 24.566, KL_loss: 1622201360878781.500, 
	
20125/191900 (epoch 10) loss: 2.499, gen_loss: 14.111, Ret_loss 2.499, FS_loss 24.569, KL_loss: 1613780788089713.000, 
	
20130/191900 (epoch 10) loss: 2.499, gen_loss: 14.112, Ret_loss 2.499, FS_loss 24.570, KL_loss: 1605208092972071.500, 
	
20135/191900 (epoch 10) loss: 2.499, gen_loss: 14.113, Ret_loss 2.499, FS_loss 24.570, KL_loss: 1596791657906355.000, 
	
20140/191900 (epoch 10) loss: 2.498, gen_loss: 14.113, Ret_loss 2.498, FS_loss 24.568, KL_loss: 1588427828820436.750, 
	
20145/191900 (epoch 10) loss: 2.499, gen_loss: 14.114, Ret_loss 2.499, FS_loss 24.569, KL_loss: 1580141009151225.750, 
	
20150/191900 (epoch 10) loss: 2.499, gen_loss: 14.114, Ret_loss 2.499, FS_loss 24.568, KL_loss: 1571991279173646.000, 
	
20155/191900 (epoch 10) loss: 2.498, gen_loss: 14.113, Ret_loss 2.498, FS_loss 24.563, KL_loss: 1563856485116117.250, 
	
20160/191900 (epoch 10) loss: 2.498, gen_loss: 14.113, Ret_loss 2.498, FS_loss 24.562, KL_loss: 1555829112845099.250, 
	
20165/191900 (epoch 10) loss: 2.498, gen_loss: 14.113, Ret_loss 2.498, FS_loss 24.561, KL_loss: 1547861376399365.500, 
	
20170/191900 (epoch 10) loss: 2.497, gen_loss: 14.114, Ret_loss 2.497, FS_loss 24.562, KL_loss: 1539996198180604.250, 
	
20175/191900 (epoch 10) loss: 2.497, gen_loss: 14.115, Ret_loss 2.497, FS_loss 24.562, KL_loss: 1532187942741751.500, 
	
20180/191900 (epoch 10) loss: 2.497, gen_loss: 14.116, Ret_loss 2.497, FS_loss 24.562, KL_loss: 1524480811552099.750, 
	
20185/191900 (epoch 10) loss: 2.497, gen_loss: 14.115, Ret_loss 2.497, FS_loss 24.560, KL_loss: 1517281423681631.750, 
	
20190/191900 (epoch 10) loss: 2.497, gen_loss: 14.116, Ret_loss 2.497, FS_loss 24.559, KL_loss: 1509703381917038.500, 
	
20195/191900 (epoch 10) loss: 2.497, gen_loss: 14.117, Ret_loss 2.497, FS_loss 24.561, KL_loss: 1503742696343870.750, 
	
20200/191900 (epoch 10) loss: 2.497, gen_loss: 14.118, Ret_loss 2.497, FS_loss 24.562, KL_loss: 1496306172035739.750, 
	
20205/191900 (epoch 10) loss: 2.497, gen_loss: 14.118, Ret_loss 2.497, FS_loss 24.560, KL_loss: 1488942737785956.000, 
	
20210/191900 (epoch 10) loss: 2.497, gen_loss: 14.120, Ret_loss 2.497, FS_loss 24.563, KL_loss: 1481662916510718.250, 
	
20215/191900 (epoch 10) loss: 2.496, gen_loss: 14.120, Ret_loss 2.496, FS_loss 24.564, KL_loss: 1474442889107287.500, 
	
20220/191900 (epoch 10) loss: 2.496, gen_loss: 14.119, Ret_loss 2.496, FS_loss 24.562, KL_loss: 1467307104434987.750, 
	
20225/191900 (epoch 10) loss: 2.497, gen_loss: 14.118, Ret_loss 2.497, FS_loss 24.559, KL_loss: 1460227841681640.500, 
	
20230/191900 (epoch 10) loss: 2.497, gen_loss: 14.118, Ret_loss 2.497, FS_loss 24.559, KL_loss: 1453236475436610.750, 
	
20235/191900 (epoch 10) loss: 2.497, gen_loss: 14.119, Ret_loss 2.497, FS_loss 24.561, KL_loss: 1446295528201695.000, 
	
20240/191900 (epoch 10) loss: 2.497, gen_loss: 14.119, Ret_loss 2.497, FS_loss 24.563, KL_loss: 1439417093966710.000, 
	
20245/191900 (epoch 10) loss: 2.497, gen_loss: 14.119, Ret_loss 2.497, FS_loss 24.561, KL_loss: 1432965591752722.750, 
	
20250/191900 (epoch 10) loss: 2.498, gen_loss: 14.119, Ret_loss 2.498, FS_loss 24.560, KL_loss: 1426213511388754.750, 
	
20255/191900 (epoch 10) loss: 2.498, gen_loss: 14.120, Ret_loss 2.498, FS_loss 24.562, KL_loss: 1419546197615801.750, 
	
20260/191900 (epoch 10) loss: 2.498, gen_loss: 14.120, Ret_loss 2.498, FS_loss 24.562, KL_loss: 1412919814552769.250, 
	
20265/191900 (epoch 10) loss: 2.497, gen_loss: 14.120, Ret_loss 2.497, FS_loss 24.562, KL_loss: 1406999887978400.000, 
	
20270/191900 (epoch 10) loss: 2.498, gen_loss: 14.123, Ret_loss 2.498, FS_loss 24.566, KL_loss: 1401475600521978.750, 
	
20275/191900 (epoch 10) loss: 2.499, gen_loss: 14.124, Ret_loss 2.499, FS_loss 24.567, KL_loss: 1395023469225172.500, 
	
20280/191900 (epoch 10) loss: 2.500, gen_loss: 14.124, Ret_loss 2.500, FS_loss 24.567, KL_loss: 1391686581647657.750, 
	
20285/191900 (epoch 10) loss: 2.499, gen_loss: 14.124, Ret_loss 2.499, FS_loss 24.566, KL_loss: 1385337730043824.000, 
	
20290/191900 (epoch 10) loss: 2.499, gen_loss: 14.124, Ret_loss 2.499, FS_loss 24.565, KL_loss: 1379046572347474.500, 
	
20295/191900 (epoch 10) loss: 2.499, gen_loss: 14.125, Ret_loss 2.499, FS_loss 24.567, KL_loss: 1372813892346753.000, 
	
20300/191900 (epoch 10) loss: 2.499, gen_loss: 14.126, Ret_loss 2.499, FS_loss 24.568, KL_loss: 1366635724183731.500, 
	
20305/191900 (epoch 10) loss: 2.498, gen_loss: 14.127, Ret_loss 2.498, FS_loss 24.572, KL_loss: 1360523764226008.250, 
	
20310/191900 (epoch 10) loss: 2.497, gen_loss: 14.128, Ret_loss 2.497, FS_loss 24.572, KL_loss: 1354455783582977.250, 
	
20315/191900 (epoch 10) loss: 2.497, gen_loss: 14.128, Ret_loss 2.497, FS_loss 24.572, KL_loss: 1348461043465247.500, 
	
20320/191900 (epoch 10) loss: 2.497, gen_loss: 14.128, Ret_loss 2.497, FS_loss 24.572, KL_loss: 1342504879792016.500, 
	
20325/191900 (epoch 10) loss: 2.498, gen_loss: 14.131, Ret_loss 2.498, FS_loss 24.575, KL_loss: 1336599988111011.000, 
	
20330/191900 (epoch 10) loss: 2.498, gen_loss: 14.133, Ret_loss 2.498, FS_loss 24.576, KL_loss: 1330772543398466.750, 
	
20335/191900 (epoch 10) loss: 2.497, gen_loss: 14.134, Ret_loss 2.497, FS_loss 24.578, KL_loss: 1324972525923041.000, 
	
20340/191900 (epoch 10) loss: 2.497, gen_loss: 14.135, Ret_loss 2.497, FS_loss 24.579, KL_loss: 1319225373530883.000, 
	
20345/191900 (epoch 10) loss: 2.496, gen_loss: 14.136, Ret_loss 2.496, FS_loss 24.580, KL_loss: 1313530311811154.250, 
	
20350/191900 (epoch 10) loss: 2.496, gen_loss: 14.136, Ret_loss 2.496, FS_loss 24.578, KL_loss: 1307876057933727.750, 
	
20355/191900 (epoch 10) loss: 2.496, gen_loss: 14.136, Ret_loss 2.496, FS_loss 24.578, KL_loss: 1303409630194642.500, 
	
20360/191900 (epoch 10) loss: 2.496, gen_loss: 14.137, Ret_loss 2.496, FS_loss 24.577, KL_loss: 1297844275878584.750, 
	
20365/191900 (epoch 10) loss: 2.496, gen_loss: 14.138, Ret_loss 2.496, FS_loss 24.577, KL_loss: 1292326902076651.750, 
	
20370/191900 (epoch 10) loss: 2.496, gen_loss: 14.138, Ret_loss 2.496, FS_loss 24.577, KL_loss: 1286855609854692.750, 
	
20375/191900 (epoch 10) loss: 2.496, gen_loss: 14.137, Ret_loss 2.496, FS_loss 24.575, KL_loss: 1281431611561057.000, 
	
20380/191900 (epoch 10) loss: 2.495, gen_loss: 14.137, Ret_loss 2.495, FS_loss 24.575, KL_loss: 1276052050231732.000, 
	
20385/191900 (epoch 10) loss: 2.495, gen_loss: 14.138, Ret_loss 2.495, FS_loss 24.576, KL_loss: 1270719816562004.000, 
	
20390/191900 (epoch 10) loss: 2.495, gen_loss: 14.138, Ret_loss 2.495, FS_loss 24.577, KL_loss: 1265429821017236.500, 
	
20395/191900 (epoch 10) loss: 2.495, gen_loss: 14.139, Ret_loss 2.495, FS_loss 24.578, KL_loss: 1263880385557180.750, 
	
20400/191900 (epoch 10) loss: 2.495, gen_loss: 14.140, Ret_loss 2.495, FS_loss 24.580, KL_loss: 1258662606544856.500, 
	
20405/191900 (epoch 10) loss: 2.495, gen_loss: 14.141, Ret_loss 2.495, FS_loss 24.582, KL_loss: 1253492280134367.250, 
	
20410/191900 (epoch 10) loss: 2.495, gen_loss: 14.141, Ret_loss 2.495, FS_loss 24.581, KL_loss: 1248364687967477.000, 
	
20415/191900 (epoch 10) loss: 2.494, gen_loss: 14.142, Ret_loss 2.494, FS_loss 24.581, KL_loss: 1243275039196827.500, 
	
20420/191900 (epoch 10) loss: 2.494, gen_loss: 14.143, Ret_loss 2.494, FS_loss 24.582, KL_loss: 1238267843695441.500, 
	
20425/191900 (epoch 10) loss: 2.493, gen_loss: 14.143, Ret_loss 2.493, FS_loss 24.583, KL_loss: 1233264333745931.750, 
	
20430/191900 (epoch 10) loss: 2.493, gen_loss: 14.144, Ret_loss 2.493, FS_loss 24.584, KL_loss: 1228384577032196.250, 
	
20435/191900 (epoch 10) loss: 2.493, gen_loss: 14.144, Ret_loss 2.493, FS_loss 24.584, KL_loss: 1223520607835546.250, 
	
20440/191900 (epoch 10) loss: 2.493, gen_loss: 14.145, Ret_loss 2.493, FS_loss 24.584, KL_loss: 1218632200139411.250, 
	
20445/191900 (epoch 10) loss: 2.493, gen_loss: 14.145, Ret_loss 2.493, FS_loss 24.583, KL_loss: 1213812714536263.250, 
	
20450/191900 (epoch 10) loss: 2.494, gen_loss: 14.144, Ret_loss 2.494, FS_loss 24.580, KL_loss: 1209002339866152.500, 
	
20455/191900 (epoch 10) loss: 2.493, gen_loss: 14.145, Ret_loss 2.493, FS_loss 24.582, KL_loss: 1204254562818796.500, 
	
20460/191900 (epoch 10) loss: 2.493, gen_loss: 14.145, Ret_loss 2.493, FS_loss 24.582, KL_loss: 1199520122791255.500, 
	
20465/191900 (epoch 10) loss: 2.493, gen_loss: 14.147, Ret_loss 2.493, FS_loss 24.585, KL_loss: 1194856041223474.000, 
	
20470/191900 (epoch 10) loss: 2.493, gen_loss: 14.148, Ret_loss 2.493, FS_loss 24.586, KL_loss: 1190193566421482.250, 
	
20475/191900 (epoch 10) loss: 2.493, gen_loss: 14.148, Ret_loss 2.493, FS_loss 24.585, KL_loss: 1193145881451520.250, 
	
20480/191900 (epoch 10) loss: 2.492, gen_loss: 14.150, Ret_loss 2.492, FS_loss 24.587, KL_loss: 1188524892180184.000, 
	
20485/191900 (epoch 10) loss: 2.492, gen_loss: 14.151, Ret_loss 2.492, FS_loss 24.587, KL_loss: 1183941425814543.250, 
	
20490/191900 (epoch 10) loss: 2.492, gen_loss: 14.149, Ret_loss 2.492, FS_loss 24.584, KL_loss: 1179391454213243.000, 
	
20495/191900 (epoch 10) loss: 2.492, gen_loss: 14.148, Ret_loss 2.492, FS_loss 24.581, KL_loss: 1174876626231301.750, 
	
20500/191900 (epoch 10) loss: 2.492, gen_loss: 14.149, Ret_loss 2.492, FS_loss 24.583, KL_loss: 1170416931102288.250, 
	
20505/191900 (epoch 10) loss: 2.492, gen_loss: 14.151, Ret_loss 2.492, FS_loss 24.585, KL_loss: 1165972546801999.500, 
	
20510/191900 (epoch 10) loss: 2.492, gen_loss: 14.152, Ret_loss 2.492, FS_loss 24.587, KL_loss: 1161573588086861.000, 
	
20515/191900 (epoch 10) loss: 2.491, gen_loss: 14.153, Ret_loss 2.491, FS_loss 24.589, KL_loss: 1157194343736351.750, 
	
20520/191900 (epoch 10) loss: 2.491, gen_loss: 14.153, Ret_loss 2.491, FS_loss 24.589, KL_loss: 1152861709493380.500, 
	
20525/191900 (epoch 10) loss: 2.491, gen_loss: 14.153, Ret_loss 2.491, FS_loss 24.587, KL_loss: 1148547611057513.250, 
	
20530/191900 (epoch 10) loss: 2.492, gen_loss: 14.154, Ret_loss 2.492, FS_loss 24.587, KL_loss: 1144274916308278.250, 
	
20535/191900 (epoch 10) loss: 2.492, gen_loss: 14.154, Ret_loss 2.492, FS_loss 24.587, KL_loss: 1140031074738248.500, 
	
20540/191900 (epoch 10) loss: 2.492, gen_loss: 14.155, Ret_loss 2.492, FS_loss 24.588, KL_loss: 1135814253248535.750, 
	
20545/191900 (epoch 10) loss: 2.492, gen_loss: 14.155, Ret_loss 2.492, FS_loss 24.587, KL_loss: 1132008971099676.250, 
	
20550/191900 (epoch 10) loss: 2.492, gen_loss: 14.157, Ret_loss 2.492, FS_loss 24.590, KL_loss: 1127850623956613.750, 
	
20555/191900 (epoch 10) loss: 2.492, gen_loss: 14.158, Ret_loss 2.492, FS_loss 24.591, KL_loss: 1123852984868797.500, 
	
20560/191900 (epoch 10) loss: 2.492, gen_loss: 14.159, Ret_loss 2.492, FS_loss 24.592, KL_loss: 1119759476639661.250, 
	
20565/191900 (epoch 10) loss: 2.492, gen_loss: 14.159, Ret_loss 2.492, FS_loss 24.592, KL_loss: 1115694773080271.875, 
	
20570/191900 (epoch 10) loss: 2.491, gen_loss: 14.161, Ret_loss 2.491, FS_loss 24.594, KL_loss: 1111763769506848.750, 
	
20575/191900 (epoch 10) loss: 2.491, gen_loss: 14.162, Ret_loss 2.491, FS_loss 24.595, KL_loss: 1107759983927348.625, 
	
20580/191900 (epoch 10) loss: 2.491, gen_loss: 14.162, Ret_loss 2.491, FS_loss 24.595, KL_loss: 1103781033274558.125, 
	
20585/191900 (epoch 10) loss: 2.491, gen_loss: 14.162, Ret_loss 2.491, FS_loss 24.595, KL_loss: 1099831445096247.875, 
	
20590/191900 (epoch 10) loss: 2.491, gen_loss: 14.161, Ret_loss 2.491, FS_loss 24.592, KL_loss: 1095969618753238.750, 
	
20595/191900 (epoch 10) loss: 2.491, gen_loss: 14.161, Ret_loss 2.491, FS_loss 24.591, KL_loss: 1092078711400875.750, 
	
20600/191900 (epoch 10) loss: 2.491, gen_loss: 14.161, Ret_loss 2.491, FS_loss 24.591, KL_loss: 1088410912650658.250, 
	
20605/191900 (epoch 10) loss: 2.490, gen_loss: 14.160, Ret_loss 2.490, FS_loss 24.591, KL_loss: 1084569761183402.125, 
	
20610/191900 (epoch 10) loss: 2.490, gen_loss: 14.161, Ret_loss 2.490, FS_loss 24.592, KL_loss: 1080927459884461.625, 
	
20615/191900 (epoch 10) loss: 2.490, gen_loss: 14.161, Ret_loss 2.490, FS_loss 24.590, KL_loss: 1077146115783410.875, 
	
20620/191900 (epoch 10) loss: 2.490, gen_loss: 14.161, Ret_loss 2.490, FS_loss 24.590, KL_loss: 1073383808148852.250, 
	
20625/191900 (epoch 10) loss: 2.490, gen_loss: 14.161, Ret_loss 2.490, FS_loss 24.591, KL_loss: 1069653395971062.875, 
	
20630/191900 (epoch 10) loss: 2.490, gen_loss: 14.162, Ret_loss 2.490, FS_loss 24.593, KL_loss: 1065994616479049.875, 
	
20635/191900 (epoch 10) loss: 2.490, gen_loss: 14.162, Ret_loss 2.490, FS_loss 24.594, KL_loss: 1062312454922154.500, 
	
20640/191900 (epoch 10) loss: 2.490, gen_loss: 14.163, Ret_loss 2.490, FS_loss 24.594, KL_loss: 1058667226990581.625, 
	
20645/191900 (epoch 10) loss: 2.490, gen_loss: 14.163, Ret_loss 2.490, FS_loss 24.594, KL_loss: 1055032910285727.875, 
	
20650/191900 (epoch 10) loss: 2.490, gen_loss: 14.163, Ret_loss 2.490, FS_loss 24.594, KL_loss: 1051443264270753.250, 
	
20655/191900 (epoch 10) loss: 2.490, gen_loss: 14.164, Ret_loss 2.490, FS_loss 24.596, KL_loss: 1047857566152298.375, 
	
20660/191900 (epoch 10) loss: 2.490, gen_loss: 14.164, Ret_loss 2.490, FS_loss 24.596, KL_loss: 1044316379930668.000, 
	
20665/191900 (epoch 10) loss: 2.490, gen_loss: 14.164, Ret_loss 2.490, FS_loss 24.597, KL_loss: 1040779866890689.000, 
	
20670/191900 (epoch 10) loss: 2.490, gen_loss: 14.165, Ret_loss 2.490, FS_loss 24.598, KL_loss: 1037305329062399.125, 
	
20675/191900 (epoch 10) loss: 2.490, gen_loss: 14.166, Ret_loss 2.490, FS_loss 24.600, KL_loss: 1033885440034625.250, 
	
20680/191900 (epoch 10) loss: 2.490, gen_loss: 14.167, Ret_loss 2.490, FS_loss 24.603, KL_loss: 1030419458649169.250, 
	
20685/191900 (epoch 10) loss: 2.490, gen_loss: 14.168, Ret_loss 2.490, FS_loss 24.603, KL_loss: 1027000718563661.500, 
	
20690/191900 (epoch 10) loss: 2.490, gen_loss: 14.167, Ret_loss 2.490, FS_loss 24.603, KL_loss: 1023580519222523.250, 
	
20695/191900 (epoch 10) loss: 2.489, gen_loss: 14.167, Ret_loss 2.489, FS_loss 24.602, KL_loss: 1020208426334727.000, 
	
20700/191900 (epoch 10) loss: 2.489, gen_loss: 14.167, Ret_loss 2.489, FS_loss 24.603, KL_loss: 1349908759233769.250, 
	
20705/191900 (epoch 10) loss: 2.489, gen_loss: 14.169, Ret_loss 2.489, FS_loss 24.606, KL_loss: 1345456797154325.000, 
	
20710/191900 (epoch 10) loss: 2.489, gen_loss: 14.170, Ret_loss 2.489, FS_loss 24.609, KL_loss: 1341352789486048.250, 
	
20715/191900 (epoch 10) loss: 2.489, gen_loss: 14.170, Ret_loss 2.489, FS_loss 24.609, KL_loss: 1336957937008922.750, 
	
20720/191900 (epoch 10) loss: 2.489, gen_loss: 14.171, Ret_loss 2.489, FS_loss 24.611, KL_loss: 1332594991706819.250, 
	
20725/191900 (epoch 10) loss: 2.488, gen_loss: 14.172, Ret_loss 2.488, FS_loss 24.612, KL_loss: 1328257521670736.750, 
	
20730/191900 (epoch 10) loss: 2.489, gen_loss: 14.173, Ret_loss 2.489, FS_loss 24.614, KL_loss: 1323959326620107.250, 
	
20735/191900 (epoch 10) loss: 2.488, gen_loss: 14.173, Ret_loss 2.488, FS_loss 24.615, KL_loss: 1319679271722547.750, 
	
20740/191900 (epoch 10) loss: 2.488, gen_loss: 14.173, Ret_loss 2.488, FS_loss 24.614, KL_loss: 1404910245798617.750, 
	
20745/191900 (epoch 10) loss: 2.489, gen_loss: 14.174, Ret_loss 2.489, FS_loss 24.616, KL_loss: 1400404704705460.500, 
	
20750/191900 (epoch 10) loss: 2.488, gen_loss: 14.174, Ret_loss 2.488, FS_loss 24.616, KL_loss: 1396157884766672.000, 
	
20755/191900 (epoch 10) loss: 2.488, gen_loss: 14.174, Ret_loss 2.488, FS_loss 24.618, KL_loss: 1391756808173916.750, 
	
20760/191900 (epoch 10) loss: 2.488, gen_loss: 14.174, Ret_loss 2.488, FS_loss 24.616, KL_loss: 1387594959400833.000, 
	
20765/191900 (epoch 10) loss: 2.488, gen_loss: 14.175, Ret_loss 2.488, FS_loss 24.618, KL_loss: 1383194477049482.500, 
	
20770/191900 (epoch 10) loss: 2.489, gen_loss: 14.176, Ret_loss 2.489, FS_loss 24.620, KL_loss: 1379002593542963.500, 
	
20775/191900 (epoch 10) loss: 2.489, gen_loss: 14.176, Ret_loss 2.489, FS_loss 24.620, KL_loss: 1374666872806598.500, 
	
20780/191900 (epoch 10) loss: 2.488, gen_loss: 14.178, Ret_loss 2.488, FS_loss 24.622, KL_loss: 1370373671588615.750, 
	
20785/191900 (epoch 10) loss: 2.489, gen_loss: 14.178, Ret_loss 2.489, FS_loss 24.623, KL_loss: 1366134381180297.500, 
	
20790/191900 (epoch 10) loss: 2.489, gen_loss: 14.178, Ret_loss 2.489, FS_loss 24.622, KL_loss: 1361870284606851.750, 
	
20795/191900 (epoch 10) loss: 2.489, gen_loss: 14.177, Ret_loss 2.489, FS_loss 24.621, KL_loss: 1357679083383593.250, 
	
20800/191900 (epoch 10) loss: 2.489, gen_loss: 14.177, Ret_loss 2.489, FS_loss 24.621, KL_loss: 1353466803446559.250, 
	
20805/191900 (epoch 10) loss: 2.489, gen_loss: 14.178, Ret_loss 2.489, FS_loss 24.622, KL_loss: 1349358335244887.000, 
	
20810/191900 (epoch 10) loss: 2.488, gen_loss: 14.179, Ret_loss 2.488, FS_loss 24.624, KL_loss: 1345197969734902.500, 
	
20815/191900 (epoch 10) loss: 2.488, gen_loss: 14.180, Ret_loss 2.488, FS_loss 24.627, KL_loss: 1341065517808002.250, 
	
20820/191900 (epoch 10) loss: 2.488, gen_loss: 14.180, Ret_loss 2.488, FS_loss 24.626, KL_loss: 1338306933276351.250, 
	
20825/191900 (epoch 10) loss: 2.488, gen_loss: 14.181, Ret_loss 2.488, FS_loss 24.628, KL_loss: 1334224498778743.750, 
	
20830/191900 (epoch 10) loss: 2.488, gen_loss: 14.182, Ret_loss 2.488, FS_loss 24.630, KL_loss: 1330181018953962.250, 
	
20835/191900 (epoch 10) loss: 2.487, gen_loss: 14.183, Ret_loss 2.487, FS_loss 24.632, KL_loss: 1326149687449956.750, 
	
20840/191900 (epoch 10) loss: 2.487, gen_loss: 14.184, Ret_loss 2.487, FS_loss 24.633, KL_loss: 1322503441951883.000, 
	
20845/191900 (epoch 10) loss: 2.487, gen_loss: 14.185, Ret_loss 2.487, FS_loss 24.635, KL_loss: 1318627870924612.750, 
	
20850/191900 (epoch 10) loss: 2.488, gen_loss: 14.186, Ret_loss 2.488, FS_loss 24.636, KL_loss: 1314666135646783.250, 
	
20855/191900 (epoch 10) loss: 2.488, gen_loss: 14.186, Ret_loss 2.488, FS_loss 24.636, KL_loss: 1310723918337382.500, 
	
20860/191900 (epoch 10) loss: 2.488, gen_loss: 14.187, Ret_loss 2.488, FS_loss 24.637, KL_loss: 1306887511215023.250, 
	
20865/191900 (epoch 10) loss: 2.488, gen_loss: 14.187, Ret_loss 2.488, FS_loss 24.637, KL_loss: 1330895105473987.750, 
	
20870/191900 (epoch 10) loss: 2.488, gen_loss: 14.188, Ret_loss 2.488, FS_loss 24.639, KL_loss: 1326936469448986.750, 
	
20875/191900 (epoch 10) loss: 2.488, gen_loss: 14.188, Ret_loss 2.488, FS_loss 24.640, KL_loss: 1323012400018337.500, 
	
20880/191900 (epoch 10) loss: 2.487, gen_loss: 14.189, Ret_loss 2.487, FS_loss 24.642, KL_loss: 1319100497180839.500, 
	
20885/191900 (epoch 10) loss: 2.487, gen_loss: 14.189, Ret_loss 2.487, FS_loss 24.643, KL_loss: 1315212152246566.250, 
	
20890/191900 (epoch 10) loss: 2.487, gen_loss: 14.189, Ret_loss 2.487, FS_loss 24.642, KL_loss: 1311346229775137.000, 
	
20895/191900 (epoch 10) loss: 2.487, gen_loss: 14.190, Ret_loss 2.487, FS_loss 24.643, KL_loss: 1307503806435998.250, 
	
20900/191900 (epoch 10) loss: 2.488, gen_loss: 14.190, Ret_loss 2.488, FS_loss 24.643, KL_loss: 1303683029085241.250, 
	
20905/191900 (epoch 10) loss: 2.488, gen_loss: 14.190, Ret_loss 2.488, FS_loss 24.644, KL_loss: 1299886268114301.000, 
	
20910/191900 (epoch 10) loss: 2.487, gen_loss: 14.190, Ret_loss 2.487, FS_loss 24.642, KL_loss: 1296112401481106.000, 
	
20915/191900 (epoch 10) loss: 2.487, gen_loss: 14.190, Ret_loss 2.487, FS_loss 24.643, KL_loss: 1292358963853278.000, 
	
20920/191900 (epoch 10) loss: 2.487, gen_loss: 14.191, Ret_loss 2.487, FS_loss 24.644, KL_loss: 1288636245768164.000, 
	
20925/191900 (epoch 10) loss: 2.487, gen_loss: 14.191, Ret_loss 2.487, FS_loss 24.646, KL_loss: 1284925966034752.000, 
	
20930/191900 (epoch 10) loss: 2.487, gen_loss: 14.192, Ret_loss 2.487, FS_loss 24.647, KL_loss: 1281285369846350.750, 
	
20935/191900 (epoch 10) loss: 2.486, gen_loss: 14.193, Ret_loss 2.486, FS_loss 24.649, KL_loss: 1277618093797949.750, 
	
20940/191900 (epoch 10) loss: 2.486, gen_loss: 14.195, Ret_loss 2.486, FS_loss 24.651, KL_loss: 1274068684543925.500, 
	
20945/191900 (epoch 10) loss: 2.486, gen_loss: 14.195, Ret_loss 2.486, FS_loss 24.652, KL_loss: 1270447691377434.500, 
	
20950/191900 (epoch 10) loss: 2.486, gen_loss: 14.195, Ret_loss 2.486, FS_loss 24.652, KL_loss: 1266848192727994.000, 
	
20955/191900 (epoch 10) loss: 2.486, gen_loss: 14.195, Ret_loss 2.486, FS_loss 24.652, KL_loss: 1263331685612331.000, 
	
20960/191900 (epoch 10) loss: 2.486, gen_loss: 14.197, Ret_loss 2.486, FS_loss 24.655, KL_loss: 1259765534940797.000, 
	
20965/191900 (epoch 10) loss: 2.486, gen_loss: 14.197, Ret_loss 2.486, FS_loss 24.655, KL_loss: 1256253973399262.750, 
	
20970/191900 (epoch 10) loss: 2.486, gen_loss: 14.198, Ret_loss 2.486, FS_loss 24.657, KL_loss: 1252728395861983.000, 
	
20975/191900 (epoch 10) loss: 2.486, gen_loss: 14.199, Ret_loss 2.486, FS_loss 24.659, KL_loss: 1249233224182433.500, 
	
20980/191900 (epoch 10) loss: 2.486, gen_loss: 14.200, Ret_loss 2.486, FS_loss 24.661, KL_loss: 1245753958900628.250, 
	
20985/191900 (epoch 10) loss: 2.486, gen_loss: 14.201, Ret_loss 2.486, FS_loss 24.662, KL_loss: 1242286986388903.250, 
	
20990/191900 (epoch 10) loss: 2.486, gen_loss: 14.201, Ret_loss 2.486, FS_loss 24.663, KL_loss: 1238964068039354.500, 
	
20995/191900 (epoch 10) loss: 2.486, gen_loss: 14.201, Ret_loss 2.486, FS_loss 24.663, KL_loss: 1235534985787069.000, 
	
21000/191900 (epoch 10) loss: 2.486, gen_loss: 14.202, Ret_loss 2.486, FS_loss 24.664, KL_loss: 1232422746168866.000, 
	
21005/191900 (epoch 10) loss: 2.486, gen_loss: 14.202, Ret_loss 2.486, FS_loss 24.665, KL_loss: 1229029899258105.500, 
	
21010/191900 (epoch 10) loss: 2.486, gen_loss: 14.203, Ret_loss 2.486, FS_loss 24.667, KL_loss: 1225655599343344.000, 
	
21015/191900 (epoch 10) loss: 2.486, gen_loss: 14.204, Ret_loss 2.486, FS_loss 24.668, KL_loss: 1222303093140350.250, 
	
21020/191900 (epoch 10) loss: 2.487, gen_loss: 14.204, Ret_loss 2.487, FS_loss 24.670, KL_loss: 1218965597676704.750, 
	
21025/191900 (epoch 10) loss: 2.486, gen_loss: 14.205, Ret_loss 2.486, FS_loss 24.671, KL_loss: 1215667661482014.500, 
	
21030/191900 (epoch 10) loss: 2.486, gen_loss: 14.205, Ret_loss 2.486, FS_loss 24.672, KL_loss: 1212367029927125.250, 
	
21035/191900 (epoch 10) loss: 2.486, gen_loss: 14.205, Ret_loss 2.486, FS_loss 24.673, KL_loss: 1209105845768994.500, 
	
21040/191900 (epoch 10) loss: 2.486, gen_loss: 14.205, Ret_loss 2.486, FS_loss 24.674, KL_loss: 1205841486628408.500, 
	
21045/191900 (epoch 10) loss: 2.486, gen_loss: 14.207, Ret_loss 2.486, FS_loss 24.678, KL_loss: 1202594067290058.250, 
	
21050/191900 (epoch 10) loss: 2.486, gen_loss: 14.206, Ret_loss 2.486, FS_loss 24.678, KL_loss: 1199385616668505.000, 
	
21055/191900 (epoch 10) loss: 2.486, gen_loss: 14.206, Ret_loss 2.486, FS_loss 24.678, KL_loss: 1196172929341476.500, 
	
21060/191900 (epoch 10) loss: 2.487, gen_loss: 14.206, Ret_loss 2.487, FS_loss 24.678, KL_loss: 1193059970589025.750, 
	
21065/191900 (epoch 10) loss: 2.487, gen_loss: 14.206, Ret_loss 2.487, FS_loss 24.680, KL_loss: 1189958033479596.250, 
	
21070/191900 (epoch 10) loss: 2.486, gen_loss: 14.207, Ret_loss 2.486, FS_loss 24.682, KL_loss: 1186796653490926.500, 
	
21075/191900 (epoch 10) loss: 2.487, gen_loss: 14.206, Ret_loss 2.487, FS_loss 24.682, KL_loss: 1183693804691020.750, 
	
21080/191900 (epoch 10) loss: 2.487, gen_loss: 14.206, Ret_loss 2.487, FS_loss 24.681, KL_loss: 1180566470555797.750, 
	
21085/191900 (epoch 10) loss: 2.487, gen_loss: 14.206, Ret_loss 2.487, FS_loss 24.682, KL_loss: 1177471795355984.250, 
	
21090/191900 (epoch 10) loss: 2.487, gen_loss: 14.206, Ret_loss 2.487, FS_loss 24.683, KL_loss: 1174380037482795.750, 
	
21095/191900 (epoch 10) loss: 2.486, gen_loss: 14.207, Ret_loss 2.486, FS_loss 24.685, KL_loss: 1171357129789478.000, 
	
21100/191900 (epoch 10) loss: 2.486, gen_loss: 14.207, Ret_loss 2.486, FS_loss 24.687, KL_loss: 1168368844208443.250, 
	
21105/191900 (epoch 10) loss: 2.487, gen_loss: 14.206, Ret_loss 2.487, FS_loss 24.687, KL_loss: 1165320474212595.000, 
	
21110/191900 (epoch 11) loss: 2.427, gen_loss: 14.508, Ret_loss 2.427, FS_loss 25.817, KL_loss: 1085159145472.000, 
	
21115/191900 (epoch 11) loss: 2.457, gen_loss: 14.406, Ret_loss 2.457, FS_loss 25.547, KL_loss: 600110745892.571, 
	
21120/191900 (epoch 11) loss: 2.463, gen_loss: 14.334, Ret_loss 2.463, FS_loss 25.358, KL_loss: 5757443877546.667, 
	
21125/191900 (epoch 11) loss: 2.449, gen_loss: 14.299, Ret_loss 2.449, FS_loss 25.245, KL_loss: 4220766247514.353, 
	
21130/191900 (epoch 11) loss: 2.450, gen_loss: 14.339, Ret_loss 2.450, FS_loss 25.288, KL_loss: 6803438163781.818, 
	
21135/191900 (epoch 11) loss: 2.448, gen_loss: 14.335, Ret_loss 2.448, FS_loss 25.308, KL_loss: 16302432604311.703, 
	
21140/191900 (epoch 11) loss: 2.464, gen_loss: 14.311, Ret_loss 2.464, FS_loss 25.273, KL_loss: 14339561477120.000, 
	
21145/191900 (epoch 11) loss: 2.451, gen_loss: 14.279, Ret_loss 2.451, FS_loss 25.243, KL_loss: 12578924392115.893, 
	
21150/191900 (epoch 11) loss: 2.442, gen_loss: 14.265, Ret_loss 2.442, FS_loss 25.176, KL_loss: 11290959076985.904, 
	
21155/191900 (epoch 11) loss: 2.453, gen_loss: 14.278, Ret_loss 2.453, FS_loss 25.183, KL_loss: 10238827576995.404, 
	
21160/191900 (epoch 11) loss: 2.454, gen_loss: 14.277, Ret_loss 2.454, FS_loss 25.168, KL_loss: 452927621675096.625, 
	
21165/191900 (epoch 11) loss: 2.452, gen_loss: 14.276, Ret_loss 2.452, FS_loss 25.159, KL_loss: 413197666368035.938, 
	
21170/191900 (epoch 11) loss: 2.460, gen_loss: 14.267, Ret_loss 2.460, FS_loss 25.139, KL_loss: 379891453318647.750, 
	
21175/191900 (epoch 11) loss: 2.457, gen_loss: 14.278, Ret_loss 2.457, FS_loss 25.138, KL_loss: 351542798970688.938, 
	
21180/191900 (epoch 11) loss: 2.458, gen_loss: 14.301, Ret_loss 2.458, FS_loss 25.169, KL_loss: 327160072226353.750, 
	
21185/191900 (epoch 11) loss: 2.462, gen_loss: 14.301, Ret_loss 2.462, FS_loss 25.177, KL_loss: 305919090955563.250, 
	
21190/191900 (epoch 11) loss: 2.461, gen_loss: 14.323, Ret_loss 2.461, FS_loss 25.195, KL_loss: 287811709423409.938, 
	
21195/191900 (epoch 11) loss: 2.451, gen_loss: 14.333, Ret_loss 2.451, FS_loss 25.211, KL_loss: 271276036441941.344, 
	
21200/191900 (epoch 11) loss: 2.449, gen_loss: 14.349, Ret_loss 2.449, FS_loss 25.221, KL_loss: 256743603318422.250, 
	
21205/191900 (epoch 11) loss: 2.450, gen_loss: 14.357, Ret_loss 2.450, FS_loss 25.226, KL_loss: 243565052927065.719, 
	
21210/191900 (epoch 11) loss: 2.447, gen_loss: 14.351, Ret_loss 2.447, FS_loss 25.213, KL_loss: 231721347509704.781, 
	
21215/191900 (epoch 11) loss: 2.445, gen_loss: 14.356, Ret_loss 2.445, FS_loss 25.204, KL_loss: 221802927792046.656, 
	
21220/191900 (epoch 11) loss: 2.450, gen_loss: 14.360, Ret_loss 2.450, FS_loss 25.200, KL_loss: 211984064364978.281, 
	
21225/191900 (epoch 11) loss: 2.456, gen_loss: 14.364, Ret_loss 2.456, FS_loss 25.195, KL_loss: 204740746013700.375, 
	
21230/191900 (epoch 11) loss: 2.458, gen_loss: 14.371, Ret_loss 2.458, FS_loss 25.196, KL_loss: 196358931748221.906, 
	
21235/191900 (epoch 11) loss: 2.458, gen_loss: 14.380, Ret_loss 2.458, FS_loss 25.206, KL_loss: 188890701937135.875, 
	
21240/191900 (epoch 11) loss: 2.467, gen_loss: 14.378, Ret_loss 2.467, FS_loss 25.197, KL_loss: 181755289411456.000, 
	
21245/191900 (epoch 11) loss: 2.467, gen_loss: 14.374, Ret_loss 2.467, FS_loss 25.187, KL_loss: 259171406668669.188, 
	
21250/191900 (epoch 11) loss: 2.466, gen_loss: 14.368, Ret_loss 2.466, FS_loss 25.169, KL_loss: 250109280786399.562, 
	
21255/191900 (epoch 11) loss: 2.461, gen_loss: 14.377, Ret_loss 2.461, FS_loss 25.180, KL_loss: 241867314674816.875, 
	
21260/191900 (epoch 11) loss: 2.461, gen_loss: 14.370, Ret_loss 2.461, FS_loss 25.165, KL_loss: 238531064751046.750, 
	
21265/191900 (epoch 11) loss: 2.458, gen_loss: 14.378, Ret_loss 2.458, FS_loss 25.168, KL_loss: 230967303681170.750, 
	
21270/191900 (epoch 11) loss: 2.458, gen_loss: 14.366, Ret_loss 2.458, FS_loss 25.142, KL_loss: 223969224459399.906, 
	
21275/191900 (epoch 11) loss: 2.457, gen_loss: 14.376, Ret_loss 2.457, FS_loss 25.148, KL_loss: 217345108853272.531, 
	
21280/191900 (epoch 11) loss: 2.455, gen_loss: 14.372, Ret_loss 2.455, FS_loss 25.136, KL_loss: 211041447216529.875, 
	
21285/191900 (epoch 11) loss: 2.458, gen_loss: 14.377, Ret_loss 2.458, FS_loss 25.146, KL_loss: 205087424470528.000, 
	
21290/191900 (epoch 11) loss: 2.459, gen_loss: 14.377, Ret_loss 2.459, FS_loss 25.138, KL_loss: 199744312311445.094, 
	
21295/191900 (epoch 11) loss: 2.456, gen_loss: 14.379, Ret_loss 2.456, FS_loss 25.145, KL_loss: 194409655283424.500, 
	
21300/191900 (epoch 11) loss: 2.459, gen_loss: 14.377, Ret_loss 2.459, FS_loss 25.141, KL_loss: 189386544569938.656, 
	
21305/191900 (epoch 11) loss: 2.459, gen_loss: 14.373, Ret_loss 2.459, FS_loss 25.136, KL_loss: 184675785398279.812, 
	
21310/191900 (epoch 11) loss: 2.458, gen_loss: 14.374, Ret_loss 2.458, FS_loss 25.140, KL_loss: 180479710149761.281, 
	
21315/191900 (epoch 11) loss: 2.461, gen_loss: 14.380, Ret_loss 2.461, FS_loss 25.150, KL_loss: 176161891095099.375, 
	
21320/191900 (epoch 11) loss: 2.459, gen_loss: 14.387, Ret_loss 2.459, FS_loss 25.163, KL_loss: 172094843223984.312, 
	
21325/191900 (epoch 11) loss: 2.457, gen_loss: 14.383, Ret_loss 2.457, FS_loss 25.158, KL_loss: 168247601314931.625, 
	
21330/191900 (epoch 11) loss: 2.457, gen_loss: 14.382, Ret_loss 2.457, FS_loss 25.157, KL_loss: 165169291515292.844, 
	
21335/191900 (epoch 11) loss: 2.459, gen_loss: 14.382, Ret_loss 2.459, FS_loss 25.156, KL_loss: 161535534795372.250, 
	
21340/191900 (epoch 11) loss: 2.461, gen_loss: 14.383, Ret_loss 2.461, FS_loss 25.161, KL_loss: 158503249454678.062, 
	
21345/191900 (epoch 11) loss: 2.461, gen_loss: 14.382, Ret_loss 2.461, FS_loss 25.158, KL_loss: 155166359635231.312, 
	
21350/191900 (epoch 11) loss: 2.462, gen_loss: 14.389, Ret_loss 2.462, FS_loss 25.171, KL_loss: 161031291053045.406, 
	
21355/191900 (epoch 11) loss: 2.463, gen_loss: 14.387, Ret_loss 2.463, FS_loss 25.168, KL_loss: 158209647187128.500, 
	
21360/191900 (epoch 11) loss: 2.462, gen_loss: 14.387, Ret_loss 2.462, FS_loss 25.171, KL_loss: 155077638626805.844, 
	
21365/191900 (epoch 11) loss: 2.463, gen_loss: 14.390, Ret_loss 2.463, FS_loss 25.180, KL_loss: 152319422716451.875, 
	
21370/191900 (epoch 11) loss: 2.459, gen_loss: 14.388, Ret_loss 2.459, FS_loss 25.176, KL_loss: 149441629567020.938, 
	
21375/191900 (epoch 11) loss: 2.461, gen_loss: 14.386, Ret_loss 2.461, FS_loss 25.173, KL_loss: 146779859166440.031, 
	
21380/191900 (epoch 11) loss: 2.462, gen_loss: 14.390, Ret_loss 2.462, FS_loss 25.182, KL_loss: 144101553816032.000, 
	
21385/191900 (epoch 11) loss: 2.462, gen_loss: 14.391, Ret_loss 2.462, FS_loss 25.186, KL_loss: 141587144121745.094, 
	
21390/191900 (epoch 11) loss: 2.460, gen_loss: 14.393, Ret_loss 2.460, FS_loss 25.194, KL_loss: 139094668687198.406, 
	
21395/191900 (epoch 11) loss: 2.463, gen_loss: 14.391, Ret_loss 2.463, FS_loss 25.190, KL_loss: 151826664080471.406, 
	
21400/191900 (epoch 11) loss: 2.461, gen_loss: 14.399, Ret_loss 2.461, FS_loss 25.205, KL_loss: 149227143523575.219, 
	
21405/191900 (epoch 11) loss: 2.461, gen_loss: 14.396, Ret_loss 2.461, FS_loss 25.201, KL_loss: 146760815795629.250, 
	
21410/191900 (epoch 11) loss: 2.459, gen_loss: 14.399, Ret_loss 2.459, FS_loss 25.205, KL_loss: 144331807972499.500, 
	
21415/191900 (epoch 11) loss: 2.459, gen_loss: 14.399, Ret_loss 2.459, FS_loss 25.205, KL_loss: 147916651240329.594, 
	
21420/191900 (epoch 11) loss: 2.458, gen_loss: 14.402, Ret_loss 2.458, FS_loss 25.209, KL_loss: 145546379059641.438, 
	
21425/191900 (epoch 11) loss: 2.459, gen_loss: 14.400, Ret_loss 2.459, FS_loss 25.208, KL_loss: 143252092863696.344, 
	
21430/191900 (epoch 11) loss: 2.459, gen_loss: 14.402, Ret_loss 2.459, FS_loss 25.216, KL_loss: 141060717413635.188, 
	
21435/191900 (epoch 11) loss: 2.459, gen_loss: 14.403, Ret_loss 2.459, FS_loss 25.217, KL_loss: 140417741891839.219, 
	
21440/191900 (epoch 11) loss: 2.458, gen_loss: 14.406, Ret_loss 2.458, FS_loss 25.225, KL_loss: 138303503168874.406, 
	
21445/191900 (epoch 11) loss: 2.457, gen_loss: 14.409, Ret_loss 2.457, FS_loss 25.231, KL_loss: 136252546460129.609, 
	
21450/191900 (epoch 11) loss: 2.457, gen_loss: 14.412, Ret_loss 2.457, FS_loss 25.237, KL_loss: 136671674510056.047, 
	
21455/191900 (epoch 11) loss: 2.457, gen_loss: 14.411, Ret_loss 2.457, FS_loss 25.236, KL_loss: 134703632289232.781, 
	
21460/191900 (epoch 11) loss: 2.457, gen_loss: 14.413, Ret_loss 2.457, FS_loss 25.241, KL_loss: 132827356636923.641, 
	
21465/191900 (epoch 11) loss: 2.458, gen_loss: 14.413, Ret_loss 2.458, FS_loss 25.243, KL_loss: 130970109534777.359, 
	
21470/191900 (epoch 11) loss: 2.460, gen_loss: 14.415, Ret_loss 2.460, FS_loss 25.246, KL_loss: 129188495345286.359, 
	
21475/191900 (epoch 11) loss: 2.462, gen_loss: 14.423, Ret_loss 2.462, FS_loss 25.258, KL_loss: 127432736804692.406, 
	
21480/191900 (epoch 11) loss: 2.461, gen_loss: 14.421, Ret_loss 2.461, FS_loss 25.253, KL_loss: 125802684377634.406, 
	
21485/191900 (epoch 11) loss: 2.460, gen_loss: 14.425, Ret_loss 2.460, FS_loss 25.263, KL_loss: 124136524700648.906, 
	
21490/191900 (epoch 11) loss: 2.460, gen_loss: 14.425, Ret_loss 2.460, FS_loss 25.266, KL_loss: 122870723079029.953, 
	
21495/191900 (epoch 11) loss: 2.458, gen_loss: 14.426, Ret_loss 2.458, FS_loss 25.270, KL_loss: 122579685545149.188, 
	
21500/191900 (epoch 11) loss: 2.457, gen_loss: 14.427, Ret_loss 2.457, FS_loss 25.276, KL_loss: 121048285397217.953, 
	
21505/191900 (epoch 11) loss: 2.457, gen_loss: 14.425, Ret_loss 2.457, FS_loss 25.275, KL_loss: 119548412123611.891, 
	
21510/191900 (epoch 11) loss: 2.456, gen_loss: 14.422, Ret_loss 2.456, FS_loss 25.270, KL_loss: 118147825908268.578, 
	
21515/191900 (epoch 11) loss: 2.456, gen_loss: 14.422, Ret_loss 2.456, FS_loss 25.269, KL_loss: 116829906156698.734, 
	
21520/191900 (epoch 11) loss: 2.455, gen_loss: 14.422, Ret_loss 2.455, FS_loss 25.272, KL_loss: 14289744827350140.000, 
	
21525/191900 (epoch 11) loss: 2.455, gen_loss: 14.422, Ret_loss 2.455, FS_loss 25.273, KL_loss: 14118419746771656.000, 
	
21530/191900 (epoch 11) loss: 2.455, gen_loss: 14.426, Ret_loss 2.455, FS_loss 25.283, KL_loss: 13951474784452118.000, 
	
21535/191900 (epoch 11) loss: 2.456, gen_loss: 14.425, Ret_loss 2.456, FS_loss 25.281, KL_loss: 13788111816089748.000, 
	
21540/191900 (epoch 11) loss: 2.455, gen_loss: 14.429, Ret_loss 2.455, FS_loss 25.292, KL_loss: 13628611813271870.000, 
	
21545/191900 (epoch 11) loss: 2.456, gen_loss: 14.433, Ret_loss 2.456, FS_loss 25.299, KL_loss: 13472684180648410.000, 
	
21550/191900 (epoch 11) loss: 2.456, gen_loss: 14.433, Ret_loss 2.456, FS_loss 25.304, KL_loss: 13320371293730134.000, 
	
21555/191900 (epoch 11) loss: 2.457, gen_loss: 14.431, Ret_loss 2.457, FS_loss 25.302, KL_loss: 13171376454863654.000, 
	
21560/191900 (epoch 11) loss: 2.457, gen_loss: 14.428, Ret_loss 2.457, FS_loss 25.299, KL_loss: 13026202096735580.000, 
	
21565/191900 (epoch 11) loss: 2.457, gen_loss: 14.427, Ret_loss 2.457, FS_loss 25.299, KL_loss: 12883684230838918.000, 
	
21570/191900 (epoch 11) loss: 2.457, gen_loss: 14.428, Ret_loss 2.457, FS_loss 25.301, KL_loss: 12744276509931222.000, 
	
21575/191900 (epoch 11) loss: 2.458, gen_loss: 14.429, Ret_loss 2.458, FS_loss 25.302, KL_loss: 12607829615615346.000, 
	
21580/191900 (epoch 11) loss: 2.459, gen_loss: 14.430, Ret_loss 2.459, FS_loss 25.305, KL_loss: 12474300021640344.000, 
	
21585/191900 (epoch 11) loss: 2.457, gen_loss: 14.431, Ret_loss 2.457, FS_loss 25.309, KL_loss: 12343546240621712.000, 
	
21590/191900 (epoch 11) loss: 2.457, gen_loss: 14.433, Ret_loss 2.457, FS_loss 25.315, KL_loss: 12246801895566624.000, 
	
21595/191900 (epoch 11) loss: 2.457, gen_loss: 14.434, Ret_loss 2.457, FS_loss 25.314, KL_loss: 12121080344718574.000, 
	
21600/191900 (epoch 11) loss: 2.457, gen_loss: 14.432, Ret_loss 2.457, FS_loss 25.312, KL_loss: 12107844794121170.000, 
	
21605/191900 (epoch 11) loss: 2.457, gen_loss: 14.432, Ret_loss 2.457, FS_loss 25.312, KL_loss: 11986057699278020.000, 
	
21610/191900 (epoch 11) loss: 2.457, gen_loss: 14.431, Ret_loss 2.457, FS_loss 25.311, KL_loss: 11866712137460892.000, 
	
21615/191900 (epoch 11) loss: 2.457, gen_loss: 14.431, Ret_loss 2.457, FS_loss 25.312, KL_loss: 11749694817718276.000, 
	
21620/191900 (epoch 11) loss: 2.457, gen_loss: 14.429, Ret_loss 2.457, FS_loss 25.309, KL_loss: 11634996139019068.000, 
	
21625/191900 (epoch 11) loss: 2.455, gen_loss: 14.427, Ret_loss 2.455, FS_loss 25.308, KL_loss: 11522477110410722.000, 
	
21630/191900 (epoch 11) loss: 2.453, gen_loss: 14.425, Ret_loss 2.453, FS_loss 25.304, KL_loss: 11412130616911170.000, 
	
21635/191900 (epoch 11) loss: 2.453, gen_loss: 14.427, Ret_loss 2.453, FS_loss 25.309, KL_loss: 11303857737411632.000, 
	
21640/191900 (epoch 11) loss: 2.453, gen_loss: 14.428, Ret_loss 2.453, FS_loss 25.315, KL_loss: 11200263358613362.000, 
	
21645/191900 (epoch 11) loss: 2.451, gen_loss: 14.427, Ret_loss 2.451, FS_loss 25.315, KL_loss: 11095987720716650.000, 
	
21650/191900 (epoch 11) loss: 2.450, gen_loss: 14.431, Ret_loss 2.450, FS_loss 25.321, KL_loss: 10996960426070064.000, 
	
21655/191900 (epoch 11) loss: 2.449, gen_loss: 14.433, Ret_loss 2.449, FS_loss 25.326, KL_loss: 10896440111422844.000, 
	
